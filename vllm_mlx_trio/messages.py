"""Every message that crosses a channel, grouped by edge.

Messages are frozen, hold tuples (never lists), and never hold an ``mx.array``: plans and
results carry token ids, block ids and numbers only. An outbox (``MemorySendChannel``)
travels inside a message; whoever holds the message owns the outbox and must close it.

The scheduler <-> executor edge (plans, results, ids) is defined in ``core/plan.py``, which
the pure ``core/`` plans with, and re-exported here. Trio is imported for type checking only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import attrs

if TYPE_CHECKING:
    import trio

from .core.params import SamplingParams

# The executor edge's messages are pure data that core/ plans with: they live in core/plan.py.
from .core.plan import (  # noqa: F401  (re-exported: every actor imports messages from here)
    BlockId,
    BlockStore,
    KVReady,
    NewSequence,
    RequestId,
    StepPlan,
    StepResult,
    TokenLogprob,
)
from .errors import VllmMlxTrioError

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


# -- engine facade -> client (through the request's outbox) -------------------------------


@_frozen
class Accepted:
    """Admission passed: the request is queued. Always the first output of a request."""

    num_prompt_tokens: int
    max_tokens: int
    #: The templated prompt ends inside the model's thinking block (the template opened it),
    #: so the reply starts as reasoning. Always False without a reasoning parser.
    starts_in_reasoning: bool = False


@_frozen
class RequestOutput:
    """New tokens for one request; ``finish_reason`` is set on the last output only.

    ``logprobs`` has one entry per token when the request asked for logprobs, else none.
    """

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    num_cached_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] = ()


@_frozen
class RequestFailed:
    """The request ended with an error; the last output it gets."""

    error: VllmMlxTrioError


Output: TypeAlias = Accepted | RequestOutput | RequestFailed
Outbox: TypeAlias = "trio.MemorySendChannel[Output]"


# -- engine facade -> AdmissionActor -----------------------------------------------------


@_frozen
class Submit:
    """A new request. ``prompt`` is raw text (completions) or a :class:`ChatPrompt` (chat)."""

    request_id: RequestId
    prompt: str | ChatPrompt
    params: SamplingParams
    outbox: Outbox
    arrival_time: float
    #: The HTTP route it came from: the ``endpoint`` label of its metrics ("" for none).
    endpoint: str = ""


# -- AdmissionActor -> SchedulerActor ----------------------------------------------------


@_frozen
class Admit:
    """A validated, tokenized request with ``params.max_tokens`` resolved to an int."""

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    outbox: Outbox
    arrival_time: float
    #: Prefix-cache keys beyond the params' own (``cache_salt``): the hashes of the prompt's
    #: media, so blocks are shared only between prompts showing the same images.
    extra_keys: tuple = ()
    #: The HTTP route it came from: the ``endpoint`` label of its metrics ("" for none).
    endpoint: str = ""
    #: The prompt's images and videos for the vision tower, in prompt order (a VLM only).
    media: tuple[MediaInput, ...] = ()
    #: ((token position where a media item's tokens start, its cache key), ...) in prompt
    #: order: folded into the prefix-cache blocks from the one each item starts in on.
    media_keys: tuple[tuple[int, str], ...] = ()

    @property
    def cache_keys(self) -> tuple:
        """Every extra key of this request's prefix-cache blocks."""
        return self.params.cache_keys + self.extra_keys


# -- SchedulerActor <-> CacheManagerActor ------------------------------------------------


@_frozen
class PrefixLookup:
    """Find (and lease) the longest cached prefix of a prompt. Answered by PrefixMatch.

    ``extra_keys`` are folded into the blocks' hashes (a cache salt): blocks are only shared
    between requests with equal extra keys. ``media_keys`` ((start position, cache key), ...)
    fold into the block each media item starts in and thereby into every later one."""

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    extra_keys: tuple = ()
    media_keys: tuple[tuple[int, str], ...] = ()


@_frozen
class PrefixMatch:
    """The leased cached prefix: ``num_cached_tokens`` tokens held in ``block_ids``."""

    request_id: RequestId
    num_cached_tokens: int
    block_ids: tuple[BlockId, ...]
    #: Those of ``block_ids`` to read back from the disk tier: (id, block hash).
    disk_blocks: tuple[tuple[BlockId, bytes], ...] = ()


@_frozen
class PrefixCommit:
    """KV for ``token_ids`` is computed and the executor holds copies of its full blocks
    from ``first_block`` on (``ready_id`` names them; ``block_nbytes`` are their sizes).
    Answered by :class:`PrefixStored`: which copies to keep, under which block ids."""

    request_id: RequestId
    token_ids: tuple[int, ...]
    extra_keys: tuple = ()
    media_keys: tuple[tuple[int, str], ...] = ()
    ready_id: int = 0
    first_block: int = 0
    block_nbytes: tuple[int, ...] = ()
    #: A checkpoint of the first ``tail_at`` tokens the executor also holds (see KVReady).
    tail_at: int | None = None
    tail_nbytes: int = 0
    blocks_end_hits: bool = True
    #: Boundary snapshots the executor also holds (see KVReady): positions and sizes.
    boundary_at: tuple[int, ...] = ()
    boundary_nbytes: tuple[int, ...] = ()


@_frozen
class PrefixStored:
    """The answer to a commit: keep copy ``block_index`` of ``ready_id`` as ``block_id`` for
    each entry of ``store`` (index -1: the tail checkpoint); ``evicted`` blocks are gone from
    the store (drop their arrays)."""

    request_id: RequestId
    ready_id: int
    store: tuple[tuple[int, BlockId], ...] = ()
    evicted: tuple[BlockId, ...] = ()
    #: Of ``evicted``, the full blocks to write to the disk tier first: (id, block hash).
    spilled: tuple[tuple[BlockId, bytes], ...] = ()


@_frozen
class PrefixRelease:
    """These requests are done (finished, aborted or failed): drop their leases.
    Answered by :class:`PrefixReleased`."""

    request_ids: tuple[RequestId, ...]


@_frozen
class PrefixReleased:
    """Blocks evicted because the release let the store get back under its budget."""

    evicted: tuple[BlockId, ...] = ()
    #: Of ``evicted``, the full blocks to write to the disk tier first: (id, block hash).
    spilled: tuple[tuple[BlockId, bytes], ...] = ()


@_frozen
class PrefixClear:
    """Drop every block no request holds (``DELETE /v1/cache``). Answered by PrefixCleared."""


@_frozen
class PrefixCleared:
    """The blocks :class:`PrefixClear` dropped (the executor frees their arrays)."""

    evicted: tuple[BlockId, ...]


CacheCommand: TypeAlias = PrefixLookup | PrefixCommit | PrefixRelease | PrefixClear
CacheReply: TypeAlias = PrefixMatch | PrefixStored | PrefixReleased | PrefixCleared


# -- SchedulerActor <-> ExecutorActor ----------------------------------------------------


@_frozen
class ModelInfo:
    """What the executor reports once the model is loaded (its ``started`` value)."""

    model_path: str
    max_context_tokens: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    tokenizer: Any = attrs.field(eq=False, repr=False)
    #: Each token's bytes for byte-level BPE tokenizers (fast streaming detokenizer), else None.
    token_bytes: tuple[bytes, ...] | None = attrs.field(default=None, eq=False, repr=False)
    #: Tokens of KV the running sequences may hold together (engine.kv_memory_mb / the
    #: model's KV bytes per token); None: no budget (only the context length limits).
    kv_budget_tokens: int | None = None
    #: KV bytes one token takes across all layers (0 when unknown).
    kv_bytes_per_token: int = 0
    #: Content-part kinds the model takes beyond text ("image_url", "video_url"); none: text only.
    media_kinds: frozenset[str] = frozenset()
    #: A VLM's prompt processor (worker/vlm_processor.py; numpy only, used in admission's
    #: preprocessing threads), None for a text model.
    media_processor: Any = attrs.field(default=None, eq=False, repr=False)


# -- engine facade -> SchedulerActor (the control channel: operator actions) -------------


@_frozen
class FailAll:
    """Fail every request the scheduler holds now (queued or running) with ``error``, in-band;
    the engine goes on and still accepts new requests. Sent at the shutdown drain's deadline."""

    error: VllmMlxTrioError


@_frozen
class ClearPrefixCache:
    """Drop every cached prefix block no running request holds (``DELETE /v1/cache``).

    ``reply`` is a one-shot channel: whoever holds the message owns it and closes it, after
    sending the number of blocks dropped, or without an answer when the engine stopped first."""

    reply: trio.MemorySendChannel[int]


ControlCommand: TypeAlias = FailAll | ClearPrefixCache
