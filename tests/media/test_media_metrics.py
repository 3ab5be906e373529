"""The media metrics: images / videos processed and preprocessing seconds, from what the loader returns."""

from __future__ import annotations

import numpy as np
from media_helpers import data_url, image, image_bytes, loader, prompt

from vllm_mlx_trio.media import LoadedVideo
from vllm_mlx_trio.metrics import EngineMetrics


def sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


def test_loaded_media_are_counted_by_kind_with_their_seconds():
    metrics = EngineMetrics("m", 128)
    images = loader().load_prompt_media(prompt(image(data_url(image_bytes())), image(data_url(image_bytes()))))
    clip = LoadedVideo(
        where="w", frames=(np.zeros((2, 2, 3), np.uint8),), fps=2.0, max_frames=4, cache_key="k", seconds=0.5
    )
    metrics.on_media_loaded((*images, clip))
    text = metrics.render().decode()
    assert sample(text, "vllm_mlx_trio_images_processed_total") == 2
    assert sample(text, "vllm_mlx_trio_videos_processed_total") == 1
    assert sample(text, "vllm_mlx_trio_media_preprocess_seconds_count") == 3
    assert sample(text, "vllm_mlx_trio_media_preprocess_seconds_sum") >= 0.5
