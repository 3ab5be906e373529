"""The chunk sizer: prompt tokens per plan beside decoding rows, from measured times."""

from __future__ import annotations

from vllm_mlx_trio.worker.batched.prefill_budget import FIRST_CHUNK_TOKENS, MIN_CHUNK_TOKENS, ChunkSizer


def feed(sizer: ChunkSizer, *, plan_s: float, token_s: float, fixed_s: float = 0.0, plans: int = 40) -> None:
    """Alternate plans without a chunk (``plan_s`` each) and chunks on a machine where a chunk
    costs ``fixed_s`` plus ``token_s`` per prompt token."""
    for _ in range(plans):
        sizer.observe_plan(plan_s)
        chunk = sizer.chunk()
        sizer.observe_chunk(fixed_s + token_s * chunk, chunk)


def test_before_any_timing_the_first_chunk_is_small_and_capped():
    assert ChunkSizer(ratio=1.0, max_tokens=512).chunk() == FIRST_CHUNK_TOKENS
    assert ChunkSizer(ratio=1.0, max_tokens=4).chunk() == 4


def test_a_chunk_costs_about_ratio_plan_periods():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, plan_s=0.004, token_s=0.0002)
    assert sizer.chunk() == 20  # 20 tokens x 0.2 ms = one 4 ms plan
    half = ChunkSizer(ratio=0.5, max_tokens=512)
    feed(half, plan_s=0.004, token_s=0.0002)
    assert half.chunk() == 10


def test_a_plan_that_runs_ahead_takes_a_larger_chunk():
    """Run-ahead: a plan of 4 decode steps takes 8 ms, so its one chunk may cost 8 ms."""
    one_step, four_steps = ChunkSizer(ratio=1.0, max_tokens=512), ChunkSizer(ratio=1.0, max_tokens=512)
    feed(one_step, plan_s=0.002, token_s=0.0002)
    feed(four_steps, plan_s=0.008, token_s=0.0002)
    assert (one_step.chunk(), four_steps.chunk()) == (10, 40)


def test_the_chunk_settles_where_its_fixed_cost_and_its_tokens_fill_the_budget():
    """A chunk's forward pass has a fixed cost: the per-token estimate includes its share, and
    the chunk settles where fixed + tokens x per-token cost = ratio x the plan's period."""
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, plan_s=0.008, token_s=0.0002, fixed_s=0.002, plans=200)
    assert abs(sizer.chunk() - 30) <= 1  # 2 ms + 30 x 0.2 ms = 8 ms


def test_the_chunk_follows_a_rising_cost_per_token():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, plan_s=0.004, token_s=0.0001)
    cheap = sizer.chunk()
    feed(sizer, plan_s=0.004, token_s=0.0004)
    assert sizer.chunk() < cheap // 2


def test_the_chunk_stays_between_the_bounds():
    sizer = ChunkSizer(ratio=1.0, max_tokens=32)
    feed(sizer, plan_s=0.004, token_s=0.000001)
    assert sizer.chunk() == 32
    slow = ChunkSizer(ratio=1.0, max_tokens=32)
    feed(slow, plan_s=0.004, token_s=0.1)
    assert slow.chunk() == MIN_CHUNK_TOKENS


def test_a_pause_is_not_taken_for_the_cost_of_a_plan_or_a_chunk():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, plan_s=0.004, token_s=0.0002)
    before = sizer.chunk()
    sizer.observe_chunk(5.0, before)  # the thread was descheduled for seconds
    assert sizer.chunk() >= before // 2
    sizer.observe_plan(5.0)  # the loop waited seconds for a plan
    assert sizer.chunk() <= 2 * before


def test_untimed_the_chunk_is_always_the_cap():
    """A sharded model's ranks must all prefill the same chunk: no clock decides it."""
    sizer = ChunkSizer(ratio=1.0, max_tokens=32, timed=False)
    feed(sizer, plan_s=0.004, token_s=0.1)
    assert sizer.chunk() == 32
