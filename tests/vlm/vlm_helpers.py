"""Helpers for the VLM tests: images as data: URLs, chat messages, and (until MEDIA's loader
lands) a tiny stand-in for iface13's MediaLoader."""

from __future__ import annotations

import base64
import hashlib
import io

import attrs
import numpy as np
from PIL import Image

from vllm_mlx_trio.messages import ImagePart

MODEL = "demo:vlm-tiny"


@attrs.frozen
class StandInImage:
    where: str
    image: Image.Image
    cache_key: str


class StandInLoader:
    """iface13's loader for base64 data: URL images only (tests only; MEDIA's is the real one)."""

    def __init__(self, cfg):
        self.cfg = cfg

    def load_prompt_media(self, prompt):
        loaded = []
        for i, message in enumerate(prompt):
            for j, part in message.media:
                assert isinstance(part, ImagePart), "the stand-in loads images only"
                data = base64.b64decode(part.ref.split(",", 1)[1])
                image = Image.open(io.BytesIO(data)).convert("RGB")
                key = hashlib.sha256(image.mode.encode() + repr(image.size).encode() + image.tobytes()).hexdigest()
                loaded.append(StandInImage(f"messages[{i}].content[{j}]", image, key))
        return tuple(loaded)


def image_url(seed: int, size: tuple[int, int] = (84, 112)) -> str:
    """A random RGB PNG as a data: URL (84x112 pixels: 12 image tokens)."""
    pixels = (np.random.default_rng(seed).random((*size, 3)) * 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_message(text: str, url: str, after: str = " Describe it.") -> dict:
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": after},
        ],
    }
