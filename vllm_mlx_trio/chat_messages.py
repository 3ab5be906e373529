"""The chat turns a request carries: text and media content parts, tool calls, and the
prompt (turns plus the template's tools and keyword arguments).

Frozen, tuple-holding values like every message; re-exported by ``messages``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, TypeAlias

import attrs

_frozen = attrs.frozen(slots=True, kw_only=True)


@_frozen
class TextPart:
    """Text in a chat turn."""

    text: str


@_frozen
class ImagePart:
    """An image in a chat turn: a reference (the bytes, or a path or URL, as given) and a
    hash of its content that keys the prefix cache. Never pixels or an ``mx.array``: a
    runner that takes images loads them on its own thread."""

    ref: bytes | str = attrs.field(repr=False)
    content_hash: str
    #: OpenAI's ``image_url.detail``: "low" loads it at a low resolution (media/loader.py);
    #: None, "auto" and "high" at the configured one.
    detail: str | None = None
    #: The OpenAI content-part type this came as, for error messages.
    kind: ClassVar[str] = "image_url"


@_frozen
class VideoPart:
    """A video in a chat turn, referenced and hashed like :class:`ImagePart`."""

    ref: bytes | str = attrs.field(repr=False)
    content_hash: str
    kind: ClassVar[str] = "video_url"


ContentPart: TypeAlias = TextPart | ImagePart | VideoPart
MediaPart: TypeAlias = ImagePart | VideoPart


@attrs.frozen(slots=True, kw_only=True, eq=False)
class MediaInput:
    """One image or video of a prompt as the model's processor left it, on its way from
    admission to the runner (Admit -> Request -> NewSequence): numpy arrays, never mlx.

    Its ``num_tokens`` placeholder tokens start at ``start`` in the prompt's token ids."""

    kind: str  # "image" or "video"
    start: int
    num_tokens: int
    #: The vision tower's input: patches (num_patches, channels * temporal * patch * patch).
    pixels: Any = attrs.field(repr=False)
    #: (t, h, w) in patches: the M-RoPE grid and the vision tower's layout.
    grid_thw: tuple[int, int, int]
    #: The loader's key of the content (and of the options that change its tokens).
    cache_key: str


def _as_parts(content: str | Iterable[ContentPart | dict] | None) -> tuple[ContentPart, ...]:
    """A plain string is one text part (the library API's ``{"content": "hi"}``), and so is an
    OpenAI text part given as a dict; parts already built are kept; None (an assistant turn
    that only called tools) is no part."""
    if content is None:
        return ()
    if isinstance(content, str):
        return (TextPart(text=content),)
    return tuple(_as_part(part) for part in content)


def _as_part(part: ContentPart | dict) -> ContentPart:
    if isinstance(part, TextPart | ImagePart | VideoPart):
        return part
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return TextPart(text=part["text"])
    raise TypeError(f"a content part is a TextPart, ImagePart, VideoPart or a text part dict, not {part!r:.80}")


@_frozen
class CalledTool:
    """A tool call an assistant turn of the history made (OpenAI's ``tool_calls`` entry);
    ``arguments`` is the JSON text as the client sent it back."""

    id: str
    name: str
    arguments: str

    def template_dict(self) -> dict[str, Any]:
        """The call as chat templates read it (Hugging Face's convention, as vLLM passes it):
        ``arguments`` decoded into an object when it is one, else left as the text."""
        try:
            arguments: Any = json.loads(self.arguments)
        except ValueError:
            arguments = self.arguments
        if not isinstance(arguments, dict):
            arguments = self.arguments
        function = {"name": self.name, "arguments": arguments}
        return {"id": self.id, "type": "function", "function": function}


def _as_called_tools(calls: Iterable[CalledTool | Mapping[str, Any]] | None) -> tuple[CalledTool, ...]:
    """Calls already built are kept; OpenAI-shaped dicts (``{"id", "function": {"name",
    "arguments"}}``, the library API's form) are converted."""
    out = []
    for call in calls or ():
        if isinstance(call, CalledTool):
            out.append(call)
            continue
        function = call["function"]
        arguments = function.get("arguments", "{}")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        out.append(CalledTool(id=str(call.get("id", "")), name=function["name"], arguments=text))
    return tuple(out)


@_frozen
class ChatMessage:
    """One chat turn: its parts in order; ``name`` (a participant's name) goes to the chat
    template as given, for templates that use it. An assistant turn may carry the
    ``tool_calls`` it made (its content then often empty) and its ``reasoning``; a ``tool``
    turn answers the call ``tool_call_id``."""

    role: str
    content: tuple[ContentPart, ...] = attrs.field(converter=_as_parts)
    name: str | None = None
    tool_calls: tuple[CalledTool, ...] = attrs.field(default=(), converter=_as_called_tools)
    tool_call_id: str | None = None
    #: An assistant turn's thinking, as a server reply returned it (``reasoning_content``).
    reasoning: str | None = None

    @property
    def text(self) -> str | None:
        """The turn as one string when every part is text (what chat templates get), else None."""
        if all(isinstance(p, TextPart) for p in self.content):
            return "".join(p.text for p in self.content)  # type: ignore[union-attr]
        return None

    @property
    def media(self) -> tuple[tuple[int, MediaPart], ...]:
        """The media parts with their index in ``content``."""
        return tuple((i, p) for i, p in enumerate(self.content) if not isinstance(p, TextPart))


def _as_messages(messages: Iterable[ChatMessage]) -> tuple[ChatMessage, ...]:
    return tuple(messages)


def _as_tools(tools: Iterable[Mapping[str, Any]] | None) -> tuple[dict[str, Any], ...] | None:
    return None if tools is None else tuple(dict(tool) for tool in tools)


def _as_kwargs(kwargs: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    items = kwargs.items() if isinstance(kwargs, Mapping) else (kwargs or ())
    return tuple((str(key), value) for key, value in items)


@attrs.frozen(slots=True, kw_only=True)
class ChatPrompt(Sequence):
    """A chat prompt: the turns, and what else the chat template is given.

    ``tools`` are the OpenAI tool objects (``{"type": "function", "function": {...}}``) the
    template renders into the prompt; ``template_kwargs`` are extra template variables
    (``chat_template_kwargs``, e.g. ``enable_thinking``, and ``reasoning_effort``). It is a
    sequence of its turns, so code that reads the turns reads them directly.
    """

    messages: tuple[ChatMessage, ...] = attrs.field(converter=_as_messages)
    tools: tuple[dict[str, Any], ...] | None = attrs.field(default=None, converter=_as_tools)
    template_kwargs: tuple[tuple[str, Any], ...] = attrs.field(default=(), converter=_as_kwargs)
    #: Frames per second sampled from each video part (``video_fps``); None: ``mllm.video_fps``.
    video_fps: float | None = None
    #: Most frames sampled from each video part (``video_max_frames``); None: ``mllm.video_max_frames``.
    video_max_frames: int | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def __getitem__(self, index: Any) -> Any:  # an int gives a turn, a slice a tuple of them
        return self.messages[index]

    def __iter__(self) -> Iterator[ChatMessage]:
        return iter(self.messages)

    def template_arguments(self) -> dict[str, Any]:
        """The keyword arguments for ``apply_chat_template`` beyond the turns (only those set,
        so a plain chat prompt calls the template exactly as before)."""
        arguments = dict(self.template_kwargs)
        if self.tools is not None:
            arguments["tools"] = [dict(tool) for tool in self.tools]
        return arguments
