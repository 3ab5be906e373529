"""Decode a video with OpenCV and sample its frames as mlx-vlm's ``load_video`` does (read
there, not imported: mlx_vlm is imported on the MLX thread only).

The bytes go to a private temporary file that is deleted when sampling ends; OpenCV never
opens a path or URL a request named. Only MP4/MOV, AVI, WebM/Matroska containers (by their
magic bytes) reach it, so a playlist or other text that would make FFmpeg open URLs or
files of its own is refused first.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import time

import numpy as np

from .images import fitted_size
from .loaded import refuse

#: The clock video deadlines are read on (tests replace it).
clock = time.monotonic
#: mlx-vlm's DEFAULT_VIDEO_SAMPLING: at least this many frames, a multiple of FRAME_FACTOR.
MIN_FRAMES = 4
FRAME_FACTOR = 2


def container_suffix(data: bytes) -> str | None:
    """The file suffix of a supported container, by magic bytes (None: not one)."""
    if data[4:8] == b"ftyp":
        return ".mp4"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return ".avi"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return ".webm"
    return None


def sample_indices(total_frames: int, source_fps: float, fps: float, max_frames: int) -> np.ndarray:
    """The frame indices mlx-vlm's ``load_video`` reads for (fps, max_frames): a count from
    the clip's duration times ``fps``, clamped to [MIN_FRAMES, max_frames] and the clip,
    rounded down to an even number, spread evenly (linspace) over the clip."""
    low = math.ceil(MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
    high = math.floor(min(max_frames, total_frames) / FRAME_FACTOR) * FRAME_FACTOR
    count = min(max(total_frames / source_fps * fps, low), high, total_frames)
    count = math.floor(count / FRAME_FACTOR) * FRAME_FACTOR
    return np.linspace(0, total_frames - 1, count).round().astype(int)


def decode_video(
    data: bytes,
    *,
    fps: float,
    max_frames: int,
    max_pixels: int,
    max_decoded_pixels: int,
    where: str,
    timeout_s: float = math.inf,
) -> tuple[tuple[np.ndarray, ...], tuple[float, ...]]:
    """The sampled frames of the video in ``data`` (HxWx3 uint8 RGB, at most ``max_pixels`` each)
    and each one's time in the video, in seconds (its frame index over the container's fps).
    Past ``timeout_s`` seconds (checked before each sampled frame is read) a 400 naming ``where``."""
    deadline = Deadline(clock() + timeout_s, timeout_s, where)
    suffix = container_suffix(data)
    if suffix is None:
        raise refuse(where, "the data is not a video in a supported container (MP4/MOV, AVI, WebM/MKV).")
    fd, path = tempfile.mkstemp(prefix="vllm-mlx-trio-video-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        return _sample_file(
            path,
            fps=fps,
            max_frames=max_frames,
            max_pixels=max_pixels,
            max_decoded_pixels=max_decoded_pixels,
            where=where,
            deadline=deadline,
        )
    except _cv2_error() as exc:
        raise refuse(where, f"the video cannot be decoded ({type(exc).__name__}).") from None
    finally:
        os.unlink(path)


def _cv2_error() -> type[Exception]:
    import cv2

    return cv2.error


class Deadline:
    """When one video's decoding must have ended."""

    def __init__(self, at: float, timeout_s: float, where: str):
        self.at, self.timeout_s, self.where = at, timeout_s, where

    def check(self) -> None:
        if clock() > self.at:
            raise refuse(
                self.where,
                f"decoding the video took longer than {self.timeout_s:g} s (mllm.video_decode_timeout_s); "
                "send a shorter or smaller clip, or fewer frames (video_fps, video_max_frames).",
            )


def _sample_file(
    path: str,
    *,
    fps: float,
    max_frames: int,
    max_pixels: int,
    max_decoded_pixels: int,
    where: str,
    deadline: Deadline,
) -> tuple[tuple[np.ndarray, ...], tuple[float, ...]]:
    import cv2  # heavy: only when a video arrives

    capture = cv2.VideoCapture(path)
    try:
        if not capture.isOpened():
            raise refuse(where, "the video cannot be decoded.")
        total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        source_fps = capture.get(cv2.CAP_PROP_FPS) or 1.0
        width, height = int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT))
        if width * height > max_decoded_pixels:
            raise refuse(where, f"the video is {width}x{height}, more than {max_decoded_pixels} pixels per frame.")
        if total < FRAME_FACTOR:
            raise refuse(where, f"the video has {max(total, 0)} frames; at least {FRAME_FACTOR} are needed.")
        frames, times = [], []
        for index in sample_indices(total, source_fps, fps, max_frames):
            deadline.check()
            capture.set(cv2.CAP_PROP_POS_FRAMES, int(index))
            ok, frame = capture.read()
            if not ok:
                break  # as load_video: the frames read so far
            frames.append(_fit_frame(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB), max_pixels, cv2))
            times.append(int(index) / source_fps)
    finally:
        capture.release()
    if not frames:
        raise refuse(where, "no frame of the video could be decoded.")
    return tuple(frames), tuple(times)


def _fit_frame(frame: np.ndarray, max_pixels: int, cv2) -> np.ndarray:
    height, width = frame.shape[:2]
    new_width, new_height = fitted_size(width, height, max_pixels)
    if (new_width, new_height) == (width, height):
        return np.ascontiguousarray(frame)
    return cv2.resize(frame, (new_width, new_height), interpolation=cv2.INTER_AREA)


def video_cache_key(data: bytes, *, fps: float, max_frames: int, max_pixels: int) -> str:
    """sha256 over the content's sha256 and the sampling options (what decides the frames)."""
    content = hashlib.sha256(data).hexdigest()
    options = f"video\0{content}\0fps={fps!r}\0max_frames={max_frames}\0max_pixels={max_pixels}"
    return hashlib.sha256(options.encode()).hexdigest()
