"""An executor whose runner stays reachable: tests and benches look at the MLX-side state
(the prefix store, the running batch's caches) through the runner it built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..actors.executor import ExecutorActor


def keeping_runners(make_runner: Callable[[Any], Any], runners: list) -> Callable[[Any, Any], ExecutorActor]:
    """An ``executor_factory`` for ``open_engine``: the real executor, each runner it builds by
    ``make_runner(request_waiting)`` appended to ``runners``."""

    def make(request_waiting):
        runner = make_runner(request_waiting)
        runners.append(runner)
        return runner

    def build(plan_recv, result_send):
        return ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=make)

    return build
