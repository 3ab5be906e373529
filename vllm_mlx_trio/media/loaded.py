"""What the loader hands the model's processor: decoded, validated media with cache keys."""

from __future__ import annotations

from typing import ClassVar, TypeAlias

import attrs
import numpy as np
from PIL import Image

from ..errors import InvalidRequestError

#: The ``code`` of every 400 about a media part.
INVALID_MEDIA = "invalid_media"


@attrs.frozen
class LoadedImage:
    """One image part, decoded: RGB, at most ``mllm.max_image_pixels`` (aspect kept)."""

    where: str
    image: Image.Image = attrs.field(repr=False, eq=False)
    #: sha256 hex over the decoded pixels (mode, size, bytes) and the options that change them.
    cache_key: str
    #: Wall seconds spent reading, fetching and decoding it (for the preprocessing histogram).
    seconds: float = 0.0
    #: The metrics' name for it (``EngineMetrics.on_media_loaded``).
    kind: ClassVar[str] = "image"


@attrs.frozen
class LoadedVideo:
    """One video part: frames sampled as mlx-vlm's ``load_video`` samples them."""

    where: str
    #: HxWx3 uint8 RGB arrays, in time order.
    frames: tuple[np.ndarray, ...] = attrs.field(repr=False, eq=False)
    fps: float
    max_frames: int
    #: sha256 hex over (the content's sha256, fps, max_frames, max_image_pixels).
    cache_key: str
    seconds: float = 0.0
    #: Each frame's time in the video, in seconds (Qwen3-VL writes them into the prompt).
    frame_times: tuple[float, ...] = attrs.field(default=(), eq=False)
    kind: ClassVar[str] = "video"


LoadedMedia: TypeAlias = LoadedImage | LoadedVideo


def refuse(where: str, reason: str) -> InvalidRequestError:
    """The 400 for a bad media part: the message starts with the part's place, ``param`` is it."""
    return InvalidRequestError(f"{where}: {reason}", param=where, code=INVALID_MEDIA)
