"""engine.max_num_batched_tokens: the step's token budget decides which prompts start."""

from __future__ import annotations

import functools

from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.scheduler import Scheduler
from vllm_mlx_trio.messages import RequestId, StepResult
from vllm_mlx_trio.testing.requests import make_request

EOS = 2


#: This file's requests: at most 8 tokens out (the prompt is what varies).
new_request = functools.partial(make_request, eos_token_ids=(EOS,), max_tokens=8)


def start_all(s: Scheduler, cached: int = 0) -> list[str]:
    started = []
    for request in s.pop_startable():
        s.start(request, num_cached_tokens=cached)
        started.append(request.request_id)
    return started


def step(s: Scheduler, *names: str) -> None:
    plan = s.build_plan()
    s.apply(StepResult(step_id=plan.step_id, sampled=tuple((RequestId(n), (5,)) for n in names)))


def test_without_a_budget_every_waiting_prompt_starts_together():
    s = Scheduler(max_running=8)
    for name in "abcde":
        s.add(new_request(name, prompt=50))
    assert start_all(s) == list("abcde")


def test_first_arrivals_are_prefilled_first_within_the_budget():
    s = Scheduler(max_running=8, max_num_batched_tokens=120, prefill_chunk_tokens=512)
    for name in "abcde":
        s.add(new_request(name, prompt=50))
    assert start_all(s) == ["a", "b"]  # 50 + 50 fit, a third 50 does not
    step(s)  # no token yet: both still prefilling, nobody else starts
    assert start_all(s) == [] and s.step_tokens == 100
    step(s, "a")  # a decodes now (1 token), b still prefills (50): 51 + 50 fits, + 50 more does not
    assert start_all(s) == ["c"] and s.step_tokens == 101
    step(s, "b", "c")
    assert start_all(s) == ["d", "e"] and s.step_tokens == 103


def test_a_long_prompt_costs_its_chunk_and_one_always_starts():
    for budget, started in ((63, ["long"]), (64, ["long", "short"])):
        s = Scheduler(max_running=8, max_num_batched_tokens=budget, prefill_chunk_tokens=32)
        s.add(new_request("long", prompt=2000))  # alone it is over the budget: it starts anyway
        s.add(new_request("short", prompt=40))
        assert start_all(s) == started  # the long one costs its chunk (32), the short one 32 too
        assert s.step_tokens == 32 * len(started)


def test_cached_tokens_and_aborts_give_the_budget_back():
    s = Scheduler(max_running=8, max_num_batched_tokens=99, prefill_chunk_tokens=512)
    s.add(new_request("a", prompt=90))
    s.add(new_request("b", prompt=90))
    assert start_all(s, cached=80) == ["a"]  # b's whole prompt counts before its lookup: 10 + 90 > 99
    assert s.step_tokens == 10  # a prefills only what the cache does not hold
    s.abort(RequestId("a"), RequestStatus.FINISHED_ABORTED)
    assert s.step_tokens == 0 and start_all(s) == ["b"]


def test_while_rows_decode_a_prompt_costs_the_smaller_decoding_chunk():
    s = Scheduler(max_running=8, max_num_batched_tokens=100, prefill_chunk_tokens=512, prefill_chunk_decoding_tokens=16)
    s.add(new_request("a", prompt=50))
    assert start_all(s) == ["a"] and s.step_tokens == 50  # alone: the full chunk (its whole prompt)
    step(s, "a")  # a decodes now
    for name in ("long1", "long2", "long3"):
        s.add(new_request(name, prompt=2000))
    # beside a decoding row each long prompt costs 16, not 512: 1 + 16 * 3 = 49 <= 100
    assert start_all(s) == ["long1", "long2", "long3"] and s.step_tokens == 1 + 16 * 3


def test_a_new_sequence_names_the_streams_that_had_their_first_token_before_it_arrived():
    """Those its prefill must not slow down; those that arrived with it wait for it."""
    s = Scheduler(max_running=8)
    early, burst, late = (
        new_request("early", prompt=10),
        new_request("burst", prompt=10),
        new_request("late", prompt=10),
    )
    burst.arrival_time = 0.5
    s.add(early)
    s.add(burst)
    start_all(s)
    early.first_token_time = 1.0  # after burst arrived: they came together
    late.arrival_time = 2.0
    s.add(late)
    start_all(s)
    by_id = {seq.request_id: seq for seq in s.build_plan().new_seqs}
    assert by_id["early"].protects == () and by_id["burst"].protects == ()
    assert by_id["late"].protects == ("early",)  # burst has no token yet
