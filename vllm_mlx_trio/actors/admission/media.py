"""Admission's media step: a chat prompt with images or videos, for a model that takes them.

Runs in a preprocessing thread (blocking: fetch, decode, resize, frame sampling, the numpy
image processor): the loader (``vllm_mlx_trio.media.MediaLoader``) turns the prompt's
media parts into pixels, the chat template renders the turns with one placeholder per part,
and the model's prompt processor (``ModelInfo.media_processor``, worker/vlm/processor.py)
expands each placeholder to the item's tokens and gives the vision tower's inputs. The
result: the prompt's token ids, the :class:`MediaInput` items the runner encodes, and the
media keys (start position, cache key) that keep two different images from sharing KV.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

import attrs

from ...messages import ChatPrompt, MediaInput, TextPart


class MediaLoader(Protocol):
    """The media loader: every media part of a prompt, loaded, in prompt order (raises
    ``InvalidRequestError`` naming the part for bad input)."""

    def load_prompt_media(self, prompt: ChatPrompt) -> tuple[Any, ...]: ...


class PromptProcessor(Protocol):
    """The model's side (worker/vlm/processor.py:VlmPromptProcessor)."""

    def expand(self, text: str, loaded: tuple[Any, ...]) -> tuple[str, list]: ...

    def media_inputs(self, token_ids: list[int], items: list, loaded: tuple[Any, ...]) -> tuple[MediaInput, ...]: ...


def make_media_loader(cfg: Any) -> MediaLoader:
    """The media loader (``vllm_mlx_trio.media``) for the ``[mllm]`` settings (imported only for a model
    that takes media)."""
    from ...media import MediaLoader as Loader

    return Loader(cfg)


@attrs.frozen(kw_only=True)
class MediaPrompt:
    """A media prompt after preprocessing."""

    token_ids: list[int]
    media: tuple[MediaInput, ...]
    #: What the loader gave (``media.LoadedImage`` / ``LoadedVideo``: kind, seconds), for the metrics.
    loaded: tuple[Any, ...] = ()
    #: Seconds spent loading the media (fetch/decode/resize) and in the image processor.
    load_s: float = 0.0
    process_s: float = 0.0

    @property
    def media_keys(self) -> tuple[tuple[int, str], ...]:
        return tuple((item.start, item.cache_key) for item in self.media)

    @property
    def num_images(self) -> int:
        return sum(item.kind == "image" for item in self.media)

    @property
    def num_videos(self) -> int:
        return sum(item.kind == "video" for item in self.media)


def process_media_prompt(
    loader: MediaLoader, processor: PromptProcessor, render: Any, encode: Any, prompt: ChatPrompt
) -> MediaPrompt:
    """Load, template, expand and tokenize. ``render(prompt) -> text`` applies the chat template;
    ``encode(text) -> ids`` tokenizes without adding special tokens (both admission's own)."""
    started = time.perf_counter()
    loaded = tuple(loader.load_prompt_media(prompt))
    loaded_at = time.perf_counter()
    text, items = processor.expand(render(prompt), loaded)
    token_ids = encode(text)
    media = processor.media_inputs(token_ids, items, loaded)
    return MediaPrompt(
        token_ids=token_ids,
        media=media,
        loaded=loaded,
        load_s=loaded_at - started,
        process_s=time.perf_counter() - loaded_at,
    )


#: What a tool's image or video becomes on a model that cannot take it (``limits.tool_result_media``).
TOOL_MEDIA_PLACEHOLDER = "[{kind} omitted: this model cannot take {kind}s]"


def tool_media_placeholders(prompt: ChatPrompt, media_kinds: frozenset[str]) -> ChatPrompt:
    """``prompt`` with each image or video part of a ``tool`` turn that the model cannot take
    replaced by a short text saying so (an agent's tool, such as a file reader, returned it;
    the user did not send it). Every other turn as given."""
    if not any(m.role == "tool" and any(p.kind not in media_kinds for _, p in m.media) for m in prompt):
        return prompt
    messages = tuple(
        attrs.evolve(message, content=tuple(_placeholder(part, media_kinds) for part in message.content))
        if message.role == "tool"
        else message
        for message in prompt
    )
    return attrs.evolve(prompt, messages=messages)


def _placeholder(part: Any, media_kinds: frozenset[str]) -> Any:
    if isinstance(part, TextPart) or part.kind in media_kinds:
        return part
    return TextPart(text=TOOL_MEDIA_PLACEHOLDER.format(kind=part.kind.removesuffix("_url")))
