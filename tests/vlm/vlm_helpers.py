"""Helpers for the VLM tests: images as data: URLs, chat messages."""

from __future__ import annotations

import base64
import io
import pathlib
import tempfile

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


def video_url(seconds: float = 3.0, fps: int = 10, size: int = 56) -> str:
    """A small MP4 (moving gradient) as a data: URL, written with OpenCV."""
    import cv2

    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (size, size))
        for index in range(int(seconds * fps)):
            frame = np.full((size, size, 3), (index * 8) % 256, dtype=np.uint8)
            frame[:, : size // 2, 1] = 255 - frame[:, : size // 2, 1]
            writer.write(frame)
        writer.release()
        data = path.read_bytes()
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


def video_message(text: str, url: str) -> dict:
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "video_url", "video_url": {"url": url}}],
    }


def media_position(demo_cache_dir: str, text_before: str) -> int:
    """Where the first media item's tokens start in a one-turn prompt whose text before it is
    ``text_before`` (the demo template: ``<|im_start|>user\\n`` + text + ``<|vision_start|>``)."""
    from tokenizers import Tokenizer

    from vllm_mlx_trio.worker.demo import resolve_demo_model

    tokenizer = Tokenizer.from_file(str(resolve_demo_model(MODEL, demo_cache_dir) / "tokenizer.json"))
    return len(tokenizer.encode(f"<|im_start|>user\n{text_before}<|vision_start|>").ids)
