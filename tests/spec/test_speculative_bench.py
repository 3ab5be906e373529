"""``bench speculative`` on the agreeing demo pair: a row per level, outputs compared, counts read."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio.bench.speculative.run import measure_speculative
from vllm_mlx_trio.config import load_config

pytestmark = pytest.mark.mlx


async def test_one_row_per_level_with_acceptance_and_identical_outputs(spec_pair):
    """The pair's draft costs a fraction of the target (a model drafting for itself would not pay: the per-round rule
    would then choose no drafts)."""
    target, draft = spec_pair
    cfg = load_config(None, overrides=[f"model.path={target}"], environ={})
    with trio.fail_after(240):
        rows = await measure_speculative(
            cfg,
            draft_model=draft,
            num_draft_tokens=3,
            runs=2,
            max_tokens=12,
            levels=(1, 3),
            sampled_temperature=0.7,
        )
    assert [(row["streams"], row["temperature"]) for row in rows] == [(1, "0"), (3, "0"), (1, "0.7")]
    alone, shared, sampled = rows
    assert sampled["identical"] == "-" and sampled["rounds"] > 0 and float(sampled["acceptance"]) > 0.8
    assert alone["identical"] == shared["identical"] == "yes"
    assert alone["rounds"] > 0 and float(alone["acceptance"]) > 0.8 and float(alone["tokens_per_round"]) > 2
    assert float(alone["speedup"]) > 0 and float(alone["cpu_speedup"]) > 0
    assert float(alone["decode_speedup"].split()[0]) > 0 and float(alone["on_ttft_ms"].split()[0]) > 0
    # three streams speculate together (a round counts once per row that drafted)
    assert shared["rounds"] > 0 and float(shared["acceptance"]) > 0.8
