"""The chunk sizer: prompt tokens per step beside decoding rows, from measured step periods."""

from __future__ import annotations

from vllm_mlx_trio.worker.prefill_budget import FIRST_CHUNK_TOKENS, MIN_CHUNK_TOKENS, ChunkSizer


def feed(sizer: ChunkSizer, *, decode_s: float, token_s: float, steps: int = 40) -> None:
    """Alternate decode-only steps and chunk steps on a machine where a step costs
    ``decode_s`` plus ``token_s`` per prompt token."""
    for _ in range(steps):
        sizer.observe(decode_s, 0)
        chunk = sizer.chunk()
        sizer.observe(decode_s + token_s * chunk, chunk)


def test_before_any_timing_the_first_chunk_is_small_and_capped():
    assert ChunkSizer(ratio=1.0, max_tokens=512).chunk() == FIRST_CHUNK_TOKENS
    assert ChunkSizer(ratio=1.0, max_tokens=4).chunk() == 4


def test_a_chunk_step_costs_about_one_plus_ratio_decode_steps():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, decode_s=0.004, token_s=0.0002)
    assert sizer.chunk() == 20  # 20 tokens x 0.2 ms = one 4 ms decode step
    half = ChunkSizer(ratio=0.5, max_tokens=512)
    feed(half, decode_s=0.004, token_s=0.0002)
    assert half.chunk() == 10


def test_the_chunk_follows_a_rising_cost_per_token():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, decode_s=0.004, token_s=0.0001)
    cheap = sizer.chunk()
    feed(sizer, decode_s=0.004, token_s=0.0004)
    assert sizer.chunk() < cheap // 2


def test_the_chunk_stays_between_the_bounds():
    sizer = ChunkSizer(ratio=1.0, max_tokens=32)
    feed(sizer, decode_s=0.004, token_s=0.000001)
    assert sizer.chunk() == 32
    slow = ChunkSizer(ratio=1.0, max_tokens=32)
    feed(slow, decode_s=0.004, token_s=0.1)
    assert slow.chunk() == MIN_CHUNK_TOKENS


def test_a_pause_is_not_taken_for_the_cost_of_a_chunk():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512)
    feed(sizer, decode_s=0.004, token_s=0.0002)
    before = sizer.chunk()
    sizer.observe(5.0, before)  # the loop waited seconds for a plan
    assert sizer.chunk() >= before // 2


def test_untimed_the_chunk_is_always_the_cap():
    """A sharded model's ranks must all prefill the same chunk: no clock decides it."""
    sizer = ChunkSizer(ratio=1.0, max_tokens=32, timed=False)
    feed(sizer, decode_s=0.004, token_s=0.1)
    assert sizer.chunk() == 32


def feed_plans(sizer: ChunkSizer, *, decode_s: float, token_s: float, plans: int = 40) -> None:
    """Plans of ``sizer.steps()`` decode steps, alternately without and with a chunk."""
    for _ in range(plans):
        sizer.observe(decode_s * sizer.steps(), 0, sizer.steps())
        chunk, steps = sizer.chunk(), sizer.steps()
        sizer.observe(decode_s * steps + token_s * chunk, chunk, steps)


def test_a_plan_of_several_decode_steps_takes_one_chunk_costing_ratio_times_their_time():
    """Run-ahead: 4 decode steps of 2 ms fit the 8 ms plan, so the chunk may cost 8 ms."""
    sizer = ChunkSizer(ratio=1.0, max_tokens=512, max_steps=8, plan_s=0.008)
    feed_plans(sizer, decode_s=0.002, token_s=0.0002)
    assert sizer.steps() == 4
    assert sizer.chunk() == 40  # 40 tokens x 0.2 ms = 4 decode steps of 2 ms
    one_step = ChunkSizer(ratio=1.0, max_tokens=512, max_steps=1, plan_s=0.008)
    feed_plans(one_step, decode_s=0.002, token_s=0.0002)
    assert one_step.steps() == 1 and one_step.chunk() == 10


def test_the_steps_a_plan_runs_are_bounded_by_its_time_and_the_step_limit():
    sizer = ChunkSizer(ratio=1.0, max_tokens=512, max_steps=8, plan_s=0.008)
    assert sizer.steps() == 1  # nothing timed yet
    sizer.observe(0.004, 0, 8)  # 0.5 ms a step: 16 would fit, 8 may run
    assert sizer.steps() == 8
    slow = ChunkSizer(ratio=1.0, max_tokens=512, max_steps=8, plan_s=0.008)
    slow.observe(0.1, 0, 1)  # a step over the plan's time: one a plan
    assert slow.steps() == 1
