"""Shared helpers of the media tests: images, data URLs, prompts, loaders."""

from __future__ import annotations

import base64
import io

from PIL import Image

from vllm_mlx_trio.config.sections import MllmSection
from vllm_mlx_trio.media import MediaLoader
from vllm_mlx_trio.messages import ChatMessage, ChatPrompt, ImagePart, TextPart, VideoPart


def image_bytes(size=(8, 6), color=(200, 30, 40), fmt="PNG") -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, fmt)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def image(ref: str) -> ImagePart:
    return ImagePart(ref=ref, content_hash="unused")


def video(ref: str) -> VideoPart:
    return VideoPart(ref=ref, content_hash="unused")


def prompt(*parts, video_fps=None, video_max_frames=None) -> ChatPrompt:
    """One system turn, then a user turn with a text part followed by ``parts``
    (so the first media part is messages[1].content[1])."""
    messages = [
        ChatMessage(role="system", content="Describe."),
        ChatMessage(role="user", content=[TextPart(text="Look:"), *parts]),
    ]
    return ChatPrompt(messages=messages, video_fps=video_fps, video_max_frames=video_max_frames)


def loader(**options) -> MediaLoader:
    resolver = options.pop("resolver", None)
    connector = options.pop("connector", None)
    return MediaLoader(MllmSection(**options), resolver=resolver, connector=connector)
