"""Helpers for the VLM tests: images as data: URLs, chat messages."""

from __future__ import annotations

import base64
import io

import numpy as np
from PIL import Image

MODEL = "demo:vlm-tiny"


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
