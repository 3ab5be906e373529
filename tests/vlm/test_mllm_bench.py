"""``bench mllm``'s phase table on the demo VLM (one run per size)."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.bench.mllm.run import IMAGE_SIDES, measure_phases
from vllm_mlx_trio.config import load_config

pytestmark = pytest.mark.mlx


def test_the_phase_table_has_every_phase_of_every_size(demo_cache_dir):
    cfg = load_config(
        None, overrides=["model.path=demo:vlm-tiny", f"model.demo_cache_dir={demo_cache_dir}"], environ={}
    )
    rows = measure_phases(cfg, runs=1)
    assert [row["image"] for row in rows] == [f"{side}x{side}" for side in IMAGE_SIDES]
    # larger images: more image tokens (the demo's processor: one token per 28x28 pixels)
    assert [row["image_tokens"] for row in rows] == [(side // 28) ** 2 for side in IMAGE_SIDES]
    for row in rows:
        for key in ("preprocess_ms", "encode_ms", "prefill_ms", "decode_ms_per_token"):
            assert float(row[key].split()[0]) > 0, (key, row)
