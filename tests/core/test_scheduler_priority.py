"""Priority preemption in the scheduling policy: a waiting request that finds the batch full
(every slot, or the KV budget) preempts the running request of the lowest priority below its
own, which comes back later and resumes from prompt + output. Exact plans, no Trio, no MLX."""

from __future__ import annotations

import functools

from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.scheduler import ADMIT_HEADROOM_TOKENS, Scheduler
from vllm_mlx_trio.messages import StepResult
from vllm_mlx_trio.testing.requests import make_request

new_request = functools.partial(make_request, prompt=10, max_tokens=100, seed=5)


def start_all(scheduler: Scheduler) -> list[str]:
    started = []
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=0)
        started.append(request.request_id)
    return started


def step(scheduler: Scheduler, token: int = 50) -> None:
    plan = scheduler.build_plan()
    rows = [*(n.request_id for n in plan.new_seqs), *plan.decode_ids]
    scheduler.apply(StepResult(step_id=plan.step_id, sampled=tuple((rid, (token,)) for rid in rows)))


def ids(requests) -> list[str]:
    return [r.request_id for r in requests]


def running_pair(max_running: int = 2, **kwargs) -> Scheduler:
    """A full batch of two priority-5 requests, a then b, each with 3 tokens out."""
    s = Scheduler(max_running=max_running, **kwargs)
    s.add(new_request("a", priority=5))
    s.add(new_request("b", priority=5))
    assert start_all(s) == ["a", "b"]
    for token in (60, 61, 62):
        step(s, token)
    return s


def test_a_higher_priority_preempts_the_latest_started_of_the_lowest_when_every_slot_is_taken():
    s = running_pair()
    b = s.running["b"]
    s.add(new_request("urgent", priority=0))
    assert start_all(s) == ["urgent"]
    assert list(s.running) == ["a", "urgent"] and ids(s.waiting) == ["b"]
    assert (b.status, b.phase, b.num_preemptions, s.num_preemptions) == (RequestStatus.WAITING, "preempted", 1, 1)
    assert s.take_priority_preemptions() == [b] and s.take_priority_preemptions() == []
    plan = s.build_plan()
    assert plan.finished_ids == ("b",) and [n.request_id for n in plan.new_seqs] == ["urgent"]


def test_the_preempted_request_resumes_from_its_prompt_and_output():
    s = running_pair()
    s.add(new_request("urgent", priority=0, max_tokens=2))
    assert start_all(s) == ["urgent"]
    step(s, 70)
    step(s, 71)  # urgent has its 2 tokens: it finishes and frees its slot
    assert start_all(s) == ["b"]
    (resumed,) = s.build_plan().new_seqs
    assert resumed.request_id == "b" and resumed.num_output_tokens == 3
    assert resumed.prompt_token_ids[-3:] == (60, 61, 62) and resumed.max_new_tokens == 97
    assert resumed.params.seed == 5


def test_the_lowest_priority_goes_first_whatever_the_order_it_started_in():
    s = Scheduler(max_running=3)
    for name, priority in (("p1", 1), ("p9", 9), ("p3", 3)):
        s.add(new_request(name, priority=priority))
    assert start_all(s) == ["p1", "p3", "p9"]  # the queue is ordered by priority
    s.add(new_request("p0", priority=0))
    assert start_all(s) == ["p0"]
    assert ids(s.take_priority_preemptions()) == ["p9"]


def test_equal_or_higher_priority_values_wait_for_a_free_slot():
    s = running_pair()
    s.add(new_request("same", priority=5))
    s.add(new_request("lower", priority=7))
    assert start_all(s) == []
    assert ids(s.waiting) == ["same", "lower"] and s.num_preemptions == 0


def test_one_arrival_preempts_only_as_many_as_it_needs():
    s = running_pair(max_running=3)
    s.add(new_request("c", priority=5))
    assert start_all(s) == ["c"]
    s.add(new_request("urgent", priority=0))
    assert start_all(s) == ["urgent"]
    assert ids(s.take_priority_preemptions()) == ["c"]  # the latest started of the priority-5 ones
    assert list(s.running) == ["a", "b", "urgent"]


def test_a_full_kv_budget_preempts_too():
    # Room for two rows of 13 tokens (+ headroom): a and b; an urgent third row needs one gone.
    s = running_pair(max_running=8, kv_budget_tokens=2 * (13 + ADMIT_HEADROOM_TOKENS))
    s.add(new_request("urgent", priority=-1))
    assert start_all(s) == ["urgent"]
    assert ids(s.take_priority_preemptions()) == ["b"] and list(s.running) == ["a", "urgent"]


def test_nobody_is_preempted_when_the_arrival_would_not_fit_anyway():
    # urgent is too long to fit beside "keep" (same priority as urgent): preempting b would not help.
    s = Scheduler(max_running=8, kv_budget_tokens=2 * (40 + ADMIT_HEADROOM_TOKENS))
    s.add(new_request("keep", priority=0, prompt=40))
    s.add(new_request("b", priority=5))
    assert start_all(s) == ["keep", "b"]
    s.add(new_request("urgent", priority=0, prompt=60))
    assert start_all(s) == []
    assert s.num_preemptions == 0 and list(s.running) == ["keep", "b"]


def test_a_preempted_request_waits_ahead_of_its_own_priority_and_behind_higher_ones():
    s = running_pair()
    s.add(new_request("later5", priority=5))
    s.add(new_request("urgent", priority=0))
    s.add(new_request("mid", priority=3))
    assert ids(s.waiting) == ["urgent", "mid", "later5"]
    # urgent preempts b; mid then finds the batch full and preempts a (priority 5 > 3)
    assert start_all(s) == ["urgent", "mid"]
    assert ids(s.take_priority_preemptions()) == ["b", "a"]
    assert ids(s.waiting) == ["a", "b", "later5"]


def test_growth_preempts_the_lowest_priority_not_the_newest():
    s = Scheduler(max_running=8, kv_budget_tokens=2 * (10 + ADMIT_HEADROOM_TOKENS), lookahead_tokens=2)
    s.add(new_request("low", priority=5))
    assert start_all(s) == ["low"]
    s.add(new_request("high", priority=0))
    assert start_all(s) == ["high"]
    for i in range(ADMIT_HEADROOM_TOKENS - 1):
        step(s, 60 + i)
    assert ids(s.preempt_for_growth()) == ["low"]
    assert list(s.running) == ["high"]
