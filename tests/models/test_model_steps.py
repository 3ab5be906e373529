"""``server.model_steps = "exclusive"``: every step of every model under one lock."""

from __future__ import annotations

import threading

from vllm_mlx_trio.models.steps import ExclusiveRunner


class RecordingRunner:
    """Records whether the lock was held while each method ran."""

    def __init__(self, lock: threading.Lock):
        self.lock, self.held, self.publish = lock, [], None

    def load(self):
        self.held.append(("load", self.lock.locked()))
        return "info"

    def execute(self, plan):
        self.held.append(("execute", self.lock.locked()))
        return plan

    def run_jobs(self, jobs):
        self.held.append(("run_jobs", self.lock.locked()))
        return jobs


def test_steps_and_jobs_hold_the_lock_and_everything_else_reaches_the_runner():
    lock = threading.Lock()
    inner = RecordingRunner(lock)
    runner = ExclusiveRunner(inner, lock)
    runner.publish = print  # the executor sets it once the runner is loaded
    assert runner.load() == "info"
    assert runner.execute("plan") == "plan" and runner.run_jobs(["job"]) == ["job"]
    assert inner.held == [("load", False), ("execute", True), ("run_jobs", True)]
    assert inner.publish is print and not lock.locked()


def test_a_runner_without_jobs_has_none_through_the_wrapper():
    lock = threading.Lock()

    class StepsOnly:
        def execute(self, plan):
            return plan

    assert getattr(ExclusiveRunner(StepsOnly(), lock), "run_jobs", None) is None
