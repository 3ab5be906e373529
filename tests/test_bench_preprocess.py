"""``bench preprocess`` on the fake executor: both settings measured, the big prompt tokenized
(and refused by the fake's 4,096-token context). Nothing here asserts on measured speed."""

from __future__ import annotations

import trio

from vllm_mlx_trio.bench.preprocess import measure_preprocess
from vllm_mlx_trio.testing.harness import fake_executor_factory


async def test_bench_preprocess_on_the_fake_executor(fake_cfg):
    with trio.fail_after(60):
        rows = await measure_preprocess(
            fake_cfg, runs=1, num_tokens=8_000, executor_factory=fake_executor_factory(step_s=0.002)
        )
    paths = ["inline (preprocess_threads=0)", "thread (preprocess_threads=1)", "no big prompt (baseline)"]
    assert [r["path"] for r in rows] == paths
    assert all(r["runs"] == 1 and r["prompt_chars"] > 4096 for r in rows[:2])  # beyond the fake context
    assert [r["big_prompt"] for r in rows] == ["refused (context_length_exceeded)"] * 2 + ["none"]
    assert all(r["itl_p95_ms"] != "-" and r["max_gap_ms"] != "-" for r in rows)
