"""The KV budget when running rows share a cached prefix once (core/shared_prefix.py): the prefix counts once, so
rows that share a long system prompt run together where copies of it would have queued them; a row that shares
nothing, or too little, counts whole; the group outlives the row that started it."""

from __future__ import annotations

from vllm_mlx_trio.core.scheduler import ADMIT_HEADROOM_TOKENS, Scheduler
from vllm_mlx_trio.core.shared_prefix import SharedPrefixCount, common_prefix, kv_tokens
from vllm_mlx_trio.testing.requests import make_request

SYSTEM = tuple(range(1000, 1000 + 2048))  # a 2,048-token system prompt, 32 blocks of 64
QUESTION = 40
BS, MIN_TOKENS = 64, 256


def prompt(i: int, system: tuple[int, ...] = SYSTEM) -> tuple[int, ...]:
    return system + tuple(range(5000 + 100 * i, 5000 + 100 * i + QUESTION))


def run_as_many(scheduler: Scheduler, num_requests: int, hit: int) -> int:
    """Queue ``num_requests`` sharing SYSTEM, start those that fit (each hits ``hit`` tokens); how many run."""
    for i in range(num_requests):
        scheduler.add(make_request(f"r{i}", prompt=prompt(i), max_tokens=64))
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=hit)
    return scheduler.num_running


def test_rows_sharing_a_long_system_prompt_run_three_times_as_many():
    row = len(prompt(0)) + ADMIT_HEADROOM_TOKENS
    budget = 4 * row  # four unshared rows
    unshared = run_as_many(Scheduler(max_running=16, kv_budget_tokens=budget), 16, hit=2048)
    shared_scheduler = Scheduler(
        max_running=16, kv_budget_tokens=budget, shared_prefix=SharedPrefixCount(BS, MIN_TOKENS)
    )
    shared = run_as_many(shared_scheduler, 16, hit=2048)
    assert unshared == 4
    assert shared >= 12
    assert shared_scheduler.kv_tokens_held <= budget < shared_scheduler.kv_tokens_unshared


def test_a_row_sharing_nothing_or_too_little_counts_whole():
    count = SharedPrefixCount(BS, MIN_TOKENS)
    count.start("a", prompt(0), 2048)
    count.start("b", prompt(1), 2048)
    count.start("c", tuple(range(9000, 9000 + 600)), 0)  # another prompt: no hit
    count.start("d", SYSTEM[:200] + tuple(range(7000, 7400)), 192)  # shares 192 < 256 tokens
    assert [count.shared(r) for r in "abcd"] == [2048, 2048, 0, 0]
    assert count.estimate(prompt(7)) == 2048
    assert count.estimate(SYSTEM[:1000] + (1,) * 50) == 960  # its common part, whole blocks only


def test_the_group_outlives_the_row_that_started_it():
    count = SharedPrefixCount(BS, MIN_TOKENS)
    count.start("a", prompt(0), 2048)
    count.start("b", prompt(1), 2048)
    count.leave("a", ["b"], lambda rid: prompt(1))
    assert count.estimate(prompt(2)) == 2048
    count.leave("b", [], lambda rid: ())
    assert count.estimate(prompt(3)) == 0
    count.start("c", prompt(3), 1024)  # a new group, from the next row's own hit
    assert count.shared("c") == 1024 and count.estimate(prompt(4)) == 1024


def test_the_batch_takes_the_prefix_once_plus_rows_times_the_longest_suffix():
    assert kv_tokens([100, 120, 50], [64, 64, 0], headroom=2) == 64 + 3 * (120 - 64 + 2)
    assert kv_tokens([], [], headroom=2) == 0
    assert common_prefix((1, 2, 3, 4), (1, 2, 9)) == 2 and common_prefix((1, 2), (1, 2, 3)) == 2
