"""``bench mllm``'s tables on the demo VLM (one run each)."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio.bench.mllm.run import IMAGE_SIDES, measure_chunking, measure_phases
from vllm_mlx_trio.bench.mllm.video import measure_video
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


def test_the_video_table_has_a_window_without_media_and_one_while_a_video_arrives(demo_cache_dir):
    cfg = load_config(
        None, overrides=["model.path=demo:vlm-tiny", f"model.demo_cache_dir={demo_cache_dir}"], environ={}
    )

    async def measure():
        with trio.fail_after(120):
            return await measure_video(cfg, 32, runs=1, seconds=2)

    quiet, video = trio.run(measure)
    assert quiet["window"].startswith("no media") and video["window"].startswith("2 s 30 fps")
    for row in (quiet, video):
        assert row["runs"] == 1 and float(row["max_gap_ms"].split()[0]) > 0 and float(row["window_s"].split()[0]) > 0


def test_the_chunking_table_has_the_streams_gaps_and_the_image_ttft_for_each_prefill(demo_cache_dir):
    cfg = load_config(
        None, overrides=["model.path=demo:vlm-tiny", f"model.demo_cache_dir={demo_cache_dir}"], environ={}
    )

    async def measure():
        with trio.fail_after(300):
            return await measure_chunking(cfg, 32, runs=1)

    rows = trio.run(measure)
    assert [row["media prefill"].split(",")[0] for row in rows] == ["chunk 32", "chunk 32", "none (prefill_step_size)"]
    for row in rows:
        assert row["runs"] == 1 and float(row["image_ttft_s"].split()[0]) > 0
        assert float(row["max_gap_ms"].split()[0]) > 0, row
