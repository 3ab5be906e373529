"""MediaLoader: every media part of a chat prompt, read, checked and decoded, in prompt order."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

from ..config.sections import MllmSection
from ..errors import InvalidRequestError
from ..messages import ChatPrompt, ImagePart, MediaPart, VideoPart
from .fetch import Connector, Resolver
from .images import decode_image, image_cache_key
from .loaded import LoadedImage, LoadedMedia, LoadedVideo, refuse
from .sources import RawMedia, read_source
from .video import decode_video, video_cache_key

#: ``detail: "low"``: OpenAI's low-resolution image is a 512x512 budget; so is this one (pixels).
LOW_DETAIL_PIXELS = 512 * 512


def media_parts(prompt: ChatPrompt) -> Iterator[tuple[str, MediaPart]]:
    """(``messages[i].content[j]``, part) for every media part, messages then parts in order."""
    for i, message in enumerate(prompt):
        for j, part in message.media:
            yield f"messages[{i}].content[{j}]", part


class MediaLoader:
    """Loads a prompt's media under the ``[mllm]`` limits. Blocking and thread-safe: it keeps
    no state between calls, so several preprocessing threads may share one.

    ``resolver`` and ``connector`` replace DNS and TCP for URL fetches (tests)."""

    def __init__(
        self, cfg: MllmSection, *, resolver: Resolver | None = None, connector: Connector | None = None
    ) -> None:
        self._cfg = cfg
        self._resolver = resolver
        self._connector = connector

    def load_prompt_media(self, prompt: ChatPrompt) -> tuple[LoadedMedia, ...]:
        """Every media part of ``prompt``, in prompt order; a 400 naming the first bad part."""
        parts = list(media_parts(prompt))
        if len(parts) > self._cfg.max_images_per_request:
            where = parts[self._cfg.max_images_per_request][0]
            limit = self._cfg.max_images_per_request
            raise refuse(where, f"a request may hold at most {limit} images and videos (mllm.max_images_per_request).")
        fps, max_frames = self.video_options(prompt) if any(isinstance(p, VideoPart) for _, p in parts) else (0.0, 0)
        loaded: list[LoadedMedia] = []
        for where, part in parts:
            if isinstance(part, ImagePart):
                loaded.append(self.load_image(part.ref, where, detail=part.detail))
            else:
                loaded.append(self.load_video(part.ref, where, fps=fps, max_frames=max_frames))
        return tuple(loaded)

    def video_options(self, prompt: ChatPrompt) -> tuple[float, int]:
        """The request's (video_fps, video_max_frames), or the ``[mllm]`` defaults; bounded."""
        cfg = self._cfg
        fps = cfg.video_fps if prompt.video_fps is None else prompt.video_fps
        max_frames = cfg.video_max_frames if prompt.video_max_frames is None else prompt.video_max_frames
        if not (math.isfinite(fps) and 0 < fps <= cfg.max_request_video_fps):
            raise InvalidRequestError(
                f"video_fps must be above 0 and at most {cfg.max_request_video_fps:g}, got {fps!r}.", param="video_fps"
            )
        if not 2 <= max_frames <= cfg.max_request_video_frames:
            raise InvalidRequestError(
                f"video_max_frames must be between 2 and {cfg.max_request_video_frames}, got {max_frames}.",
                param="video_max_frames",
            )
        return fps, max_frames

    def load_image(self, ref: bytes | str, where: str, *, detail: str | None = None) -> LoadedImage:
        """``detail="low"`` (OpenAI's low-resolution image) caps it at :data:`LOW_DETAIL_PIXELS`."""
        start = time.perf_counter()
        cfg = self._cfg
        max_pixels = min(cfg.max_image_pixels, LOW_DETAIL_PIXELS) if detail == "low" else cfg.max_image_pixels
        raw = self._read(ref, "image", cfg.max_image_bytes, where)
        image = decode_image(raw.data, max_pixels=max_pixels, max_decoded_pixels=cfg.max_decoded_pixels, where=where)
        key = image_cache_key(image, max_pixels=max_pixels)
        return LoadedImage(where=where, image=image, cache_key=key, seconds=time.perf_counter() - start)

    def load_video(self, ref: bytes | str, where: str, *, fps: float, max_frames: int) -> LoadedVideo:
        start = time.perf_counter()
        cfg = self._cfg
        raw = self._read(ref, "video", cfg.max_video_bytes, where)
        frames, frame_times = decode_video(
            raw.data,
            fps=fps,
            max_frames=max_frames,
            max_pixels=cfg.max_image_pixels,
            max_decoded_pixels=cfg.max_decoded_pixels,
            where=where,
            timeout_s=cfg.video_decode_timeout_s,
        )
        key = video_cache_key(raw.data, fps=fps, max_frames=max_frames, max_pixels=cfg.max_image_pixels)
        seconds = time.perf_counter() - start
        return LoadedVideo(
            where=where,
            frames=frames,
            fps=fps,
            max_frames=max_frames,
            cache_key=key,
            seconds=seconds,
            frame_times=frame_times,
        )

    def _read(self, ref: bytes | str, kind: str, max_bytes: int, where: str) -> RawMedia:
        return read_source(
            ref,
            kind=kind,
            max_bytes=max_bytes,
            cfg=self._cfg,
            where=where,
            resolver=self._resolver,
            connector=self._connector,
        )
