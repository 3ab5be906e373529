"""The KV budget in the scheduling policy: who may join the batch, who is preempted, and how
a preempted request comes back. Exact plans for scripted events, no Trio, no MLX."""

from __future__ import annotations

import functools

from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.scheduler import ADMIT_HEADROOM_TOKENS, Scheduler
from vllm_mlx_trio.messages import StepResult
from vllm_mlx_trio.testing.requests import make_request

EOS = 2


#: This file's requests: 10 prompt tokens, at most 100 out, and params a preemption must keep.
new_request = functools.partial(
    make_request, prompt=10, eos_token_ids=(EOS,), max_tokens=100, min_tokens=1, presence_penalty=0.5
)


def start_all(scheduler: Scheduler) -> list[str]:
    started = []
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=0)
        started.append(request.request_id)
    return started


def step(scheduler: Scheduler, token: int = 50) -> StepResult:
    """Build the next plan and answer it with ``token`` for every row in it."""
    plan = scheduler.build_plan()
    rows = [*(n.request_id for n in plan.new_seqs), *plan.decode_ids]
    result = StepResult(step_id=plan.step_id, sampled=tuple((rid, (token,)) for rid in rows))
    scheduler.apply(result)
    return result


def test_a_request_joins_only_with_headroom_for_every_row():
    # Two rows of 10 tokens need 2 x (10 + headroom); one slot short of that keeps b waiting.
    need = 2 * (10 + ADMIT_HEADROOM_TOKENS)
    tight = Scheduler(max_running=8, kv_budget_tokens=need - 1)
    roomy = Scheduler(max_running=8, kv_budget_tokens=need)
    for s in (tight, roomy):
        s.add(new_request("a"))
        s.add(new_request("b"))
    assert start_all(tight) == ["a"] and [r.request_id for r in tight.waiting] == ["b"]
    assert start_all(roomy) == ["a", "b"]


def test_the_head_of_the_queue_is_never_overtaken():
    s = Scheduler(max_running=8, kv_budget_tokens=100)
    s.add(new_request("a", prompt=40))
    s.add(new_request("big", prompt=60))
    s.add(new_request("small", prompt=2))  # would fit, but arrived after "big"
    assert start_all(s) == ["a"]
    assert [r.request_id for r in s.waiting] == ["big", "small"]


def test_the_oldest_request_runs_alone_whatever_its_size():
    s = Scheduler(max_running=8, kv_budget_tokens=50)
    s.add(new_request("a", prompt=45))
    assert start_all(s) == ["a"]


def test_growth_preempts_the_newest_and_it_resumes_from_prompt_plus_output():
    s = Scheduler(max_running=8, kv_budget_tokens=2 * (10 + ADMIT_HEADROOM_TOKENS), lookahead_tokens=2)
    a, b = new_request("a"), new_request("b")
    s.add(a)
    s.add(b)
    assert start_all(s) == ["a", "b"]
    for i in range(ADMIT_HEADROOM_TOKENS - 2):  # both grow until 2 rows x (len + 2) is full
        step(s, token=60 + i)
        assert s.preempt_for_growth() == [], i
    step(s, token=99)
    assert s.preempt_for_growth() == [b]
    assert (b.status, b.phase, b.num_preemptions, s.num_preemptions) == (RequestStatus.WAITING, "preempted", 1, 1)
    assert list(s.running) == ["a"] and list(s.waiting) == [b]
    assert s.pending_drops() == ("b",)
    plan = s.build_plan()
    assert plan.finished_ids == ("b",) and plan.decode_ids == ("a",)
    # While the batch is still too full, b waits; once a finishes it comes back.
    assert start_all(s) == []
    s.abort("a", RequestStatus.FINISHED_STOPPED)
    assert start_all(s) == ["b"]
    new = s.build_plan().new_seqs[0]
    assert new.prompt_token_ids == b.prompt_token_ids + tuple(b.output_token_ids)
    assert new.num_output_tokens == b.num_output_tokens == ADMIT_HEADROOM_TOKENS - 1
    assert new.output_token_ids == tuple(b.output_token_ids)
    assert new.max_new_tokens == 100 - new.num_output_tokens


def test_results_of_steps_planned_before_a_preemption_are_ignored():
    s = Scheduler(max_running=8, kv_budget_tokens=1000)
    a, b = new_request("a"), new_request("b")
    s.add(a)
    s.add(b)
    start_all(s)
    in_flight = s.build_plan()  # planned while b still ran
    s.kv_budget_tokens = 2 * (a.num_tokens + 1) - 1  # memory got short
    assert s.preempt_for_growth() == [b]
    assert start_all(s) == []
    s.kv_budget_tokens = 1000
    assert start_all(s) == ["b"]  # restarted before the old step's result came back
    s.apply(StepResult(step_id=in_flight.step_id, sampled=(("a", (5,)), ("b", (6,)))))
    assert a.output_token_ids == [5] and b.output_token_ids == []
    replan = s.build_plan()
    assert replan.finished_ids == ("b",) and [n.request_id for n in replan.new_seqs] == ["b"]
    s.apply(StepResult(step_id=replan.step_id, sampled=(("b", (7,)), ("a", (8,)))))
    assert b.output_token_ids == [7] and a.output_token_ids == [5, 8]


def test_without_a_budget_nothing_is_preempted():
    s = Scheduler(max_running=8)
    for name in "abcd":
        s.add(new_request(name, prompt=1000))
    assert start_all(s) == ["a", "b", "c", "d"]
    step(s)
    assert s.preempt_for_growth() == [] and s.kv_tokens_held == 4 * 1001


def test_kv_tokens_held_is_rows_times_the_longest_row():
    s = Scheduler(max_running=8, kv_budget_tokens=10_000)
    s.add(new_request("a", prompt=30))
    s.add(new_request("b", prompt=10))
    start_all(s)
    assert s.kv_tokens_held == 2 * 30
    step(s)
    assert s.kv_tokens_held == 2 * 31


def test_usage_keeps_the_first_runs_cached_tokens():
    s = Scheduler(max_running=8, kv_budget_tokens=1000)
    a, b = new_request("a"), new_request("b")
    s.add(a)
    s.add(b)
    for request in s.pop_startable():
        s.start(request, num_cached_tokens=8)
    s.kv_budget_tokens = 2 * (a.num_tokens + 1) - 1
    assert s.preempt_for_growth() == [b]
    s.abort("a", RequestStatus.FINISHED_STOPPED)
    for request in s.pop_startable():
        s.start(request, num_cached_tokens=0)
    assert b.num_cached_tokens == 8
