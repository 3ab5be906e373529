"""The scheduling policy alone: exact plans for a scripted sequence of events."""

from __future__ import annotations

import functools

from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.scheduler import Scheduler
from vllm_mlx_trio.messages import RequestId, StepResult
from vllm_mlx_trio.testing.requests import make_request

EOS = 2


#: This file's requests: 2 prompt tokens, at most 3 out, token 7 a stop token.
new_request = functools.partial(make_request, eos_token_ids=(EOS,), max_tokens=3, stop_token_ids=(7,))


def start_all(scheduler: Scheduler) -> list[str]:
    started = []
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=0)
        started.append(request.request_id)
    return started


def test_one_runs_at_a_time_in_arrival_order():
    s = Scheduler(max_running=1)
    a, b = new_request("a"), new_request("b")
    s.add(a)
    s.add(b)
    assert start_all(s) == ["a"]
    plan = s.build_plan()
    assert [n.request_id for n in plan.new_seqs] == ["a"] and plan.decode_ids == ()
    assert s.apply(StepResult(step_id=plan.step_id, sampled=(("a", (5,)),))) == [a]
    assert start_all(s) == []
    assert s.build_plan().decode_ids == ("a",)


def test_finish_reasons_and_drop_in_next_plan():
    s = Scheduler(max_running=1)
    a = new_request("a", max_tokens=2)
    s.add(a)
    start_all(s)
    s.build_plan()
    s.apply(StepResult(step_id=0, sampled=(("a", (5,)),)))
    assert a.status == RequestStatus.RUNNING
    s.apply(StepResult(step_id=1, sampled=(("a", (6,)),)))
    assert (a.status, a.finish_reason, a.take_undelivered()[0]) == (RequestStatus.FINISHED_LENGTH, "length", (5, 6))
    assert s.pending_drops() == ("a",)
    plan = s.build_plan()
    assert plan.finished_ids == ("a",) and plan.decode_ids == () and not s.has_work


def test_a_finished_requests_lease_is_released_once_even_after_a_join_plan_took_its_drop():
    s = Scheduler(max_running=2)
    a, b = new_request("a", max_tokens=1), new_request("b", max_tokens=9)
    s.add(a)
    start_all(s)
    s.build_plan()
    s.apply(StepResult(step_id=0, sampled=(("a", (5,)),), plan_continues=True))  # a step inside a plan
    s.add(b)
    start_all(s)
    join = s.build_plan(join_previous=True)  # before the plan's own result: it takes a's drop
    assert join.finished_ids == ("a",) and s.pending_drops() == ()
    assert s.take_lease_releases() == ("a",)  # the lease still ends
    assert s.take_lease_releases() == ()  # once


def test_eos_and_stop_token_ids_stop():
    for token in (EOS, 7):
        request = new_request("a", max_tokens=10)
        request.status = RequestStatus.RUNNING
        request.append_tokens((4, token, 9))
        assert request.finish_reason == "stop"
        assert request.take_undelivered()[0] == (4, token)  # nothing after the stop


def test_abort_is_a_noop_for_unknown_or_finished():
    s = Scheduler(max_running=1)
    assert s.abort(RequestId("nope"), RequestStatus.FINISHED_ABORTED) is None
    a = new_request("a")
    s.add(a)
    start_all(s)
    assert s.abort(RequestId("a"), RequestStatus.FINISHED_ABORTED) is a
    assert s.abort(RequestId("a"), RequestStatus.FINISHED_ABORTED) is None
    plan = s.build_plan()
    assert plan.new_seqs == () and plan.finished_ids == ("a",)  # never started, still dropped once
    assert s.build_plan() is None


def test_tokens_for_an_aborted_request_are_dropped():
    s = Scheduler(max_running=1)
    s.add(new_request("a"))
    start_all(s)
    s.build_plan()
    s.abort(RequestId("a"), RequestStatus.FINISHED_ABORTED)
    assert s.apply(StepResult(step_id=0, sampled=(("a", (5,)),))) == []
