"""``vllm-mlx-trio bench mllm``, part 3: do running text streams stall while a long video arrives?

4 greedy text streams run on one engine (the VLM, media prefill chunked and the vision encoding
spread over steps as configured). In each run, first a window with no media request (the normal
decode step: the reference), then one request with a long video (:data:`VIDEO_SECONDS` s at
:data:`VIDEO_FPS` fps, decoded by the media loader in admission's preprocessing thread, sampled
to ``mllm.video_max_frames`` frames, encoded and prefilled on the MLX thread) is submitted; the
streams' inter-token gaps are taken from its submit to its first token. Runs alternate the two
windows; each row gives the median of its runs and their spread.
"""

from __future__ import annotations

import base64
import pathlib
import tempfile
from typing import Any

import numpy as np
import trio

from ...config import EngineConfig
from ...core.params import SamplingParams
from ...engine import open_engine
from ...messages import ChatMessage, ChatPrompt, TextPart, VideoPart
from ..stats import runs_spread
from .run import SETTLE_S, gap_stats, start_text_streams, vlm_config

#: The long video: seconds, frames per second, and frame side in pixels.
VIDEO_SECONDS = 60
VIDEO_FPS = 30
VIDEO_SIDE = 224


def mp4_data_url(seconds: float = VIDEO_SECONDS, fps: int = VIDEO_FPS, side: int = VIDEO_SIDE, seed: int = 0) -> str:
    """An MP4 of moving noise as a data: URL (OpenCV's ``mp4v`` writer, the loader's own decoder)."""
    import cv2

    rng = np.random.default_rng(seed)
    base = (rng.random((side, side, 3)) * 255).astype(np.uint8)
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (side, side))
        for index in range(int(seconds * fps)):
            writer.write(np.roll(base, index, axis=1))
        writer.release()
        data = path.read_bytes()
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


def video_prompt(url: str, seed: int) -> ChatPrompt:
    video = VideoPart(ref=url, content_hash=f"bench-video-{seed}")
    text = TextPart(text="What happens in this video?")
    return ChatPrompt(messages=(ChatMessage(role="user", content=(video, text)),))


async def measure_windows(engine: Any, url: str, seed: int) -> tuple[dict, dict]:
    """One run: the streams' gaps over a window without media, then from the video's submit to
    its first token."""
    async with trio.open_nursery() as nursery:
        arrivals = await start_text_streams(nursery, engine)
        await trio.sleep(SETTLE_S)
        quiet_begin = trio.current_time()
        await trio.sleep(SETTLE_S * 2)
        begin = trio.current_time()
        async for _delta in engine.generate(video_prompt(url, seed), SamplingParams(temperature=0.0, max_tokens=1)):
            break
        end = trio.current_time()
        nursery.cancel_scope.cancel()
    return _window(arrivals, quiet_begin, begin), _window(arrivals, begin, end)


def _window(arrivals: list[list[float]], begin: float, end: float) -> dict:
    return {"window_s": end - begin, **gap_stats(arrivals, begin, end)}


async def measure_video(cfg: EngineConfig, chunk: int, runs: int = 3, *, seconds: float = VIDEO_SECONDS) -> list[dict]:
    """The no-media window's row and the video window's (a video of ``seconds``)."""
    url = mp4_data_url(seconds)
    quiet, video = [], []
    async with open_engine(vlm_config(cfg, chunk)) as engine:
        for run in range(runs):
            without, during = await measure_windows(engine, url, run)
            quiet.append(without)
            video.append(during)
    name = f"{seconds:g} s {VIDEO_FPS} fps {VIDEO_SIDE}x{VIDEO_SIDE} video arrives"
    return [_row("no media (the normal step)", quiet), _row(name, video)]


def _row(name: str, runs: list[dict]) -> dict:
    return {
        "window": name,
        "runs": len(runs),
        "itl_p50_ms": runs_spread(runs, "itl_p50_ms"),
        "itl_p95_ms": runs_spread(runs, "itl_p95_ms"),
        "max_gap_ms": runs_spread(runs, "max_gap_ms"),
        "window_s": runs_spread(runs, "window_s", 2),
    }
