"""``bench structured`` on the tiny demo model: both settings measured, with a constrained
row in the second. Nothing here asserts on measured speed."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio.bench.structured import measure_structured

pytestmark = pytest.mark.mlx


async def test_bench_structured_measures_both_settings(demo_cfg):
    with trio.fail_after(180):
        rows = await measure_structured(demo_cfg, runs=1, rows=2, max_tokens=8)
    assert [r["setting"] for r in rows] == ["unconstrained", "one constrained row"]
    assert rows[0]["neighbour_ratio"] == "1.000" and rows[0]["constrained_tok_s"] == "-"
    assert rows[1]["constrained_tok_s"] != "-" and float(rows[1]["constrained_ratio"]) > 0
