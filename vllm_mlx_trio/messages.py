"""Every message that crosses a channel, grouped by edge.

Messages are frozen, hold tuples (never lists), and never hold an ``mx.array``: plans and
results carry token ids, block ids and numbers only. An outbox (``MemorySendChannel``)
travels inside a message; whoever holds the message owns the outbox and must close it.

The scheduler <-> executor edge (plans, results, ids) is defined in ``core/plan.py``, which
the pure ``core/`` plans with, and re-exported here. Trio is imported for type checking only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

if TYPE_CHECKING:
    import trio

from .chat_messages import (  # noqa: F401  (re-exported: every actor imports messages from here)
    CalledTool,
    ChatMessage,
    ChatPrompt,
    ContentPart,
    ImagePart,
    MediaInput,
    MediaPart,
    TextPart,
    VideoPart,
)
from .core.params import SamplingParams

# The executor edge's messages are pure data that core/ plans with: they live in core/plan.py.
from .core.plan import (  # noqa: F401  (re-exported: every actor imports messages from here)
    BlockId,
    BlockStore,
    KVReady,
    NewSequence,
    PlanMessage,
    RequestId,
    RequestWaiting,
    StepPlan,
    StepResult,
    TokenLogprob,
)
from .errors import VllmMlxTrioError

_frozen = attrs.frozen(slots=True, kw_only=True)


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
    #: A VLM's prompt processor (worker/vlm/processor.py; numpy only, used in admission's
    #: preprocessing threads), None for a text model.
    media_processor: Any = attrs.field(default=None, eq=False, repr=False)
    #: Why a model that declares a vision or audio tower is served text-only (its media parts'
    #: 400 says it); None when it is not (a text model, or a VLM served with its media).
    text_only_note: str | None = None
    #: The runner kind serving the model ("batched", "vlm", ...: what engine.mode "auto" chose);
    #: empty for a runner that names none.
    runner_kind: str = ""
    #: An embedding model's facts (engine.mode = "embed"): it answers :class:`EmbedJob` and
    #: generates no text. None: a generative model.
    embedding: EmbeddingInfo | None = None
    #: Whether running rows that share a cached prefix hold it once (cache.share_prefix_in_batch), and if
    #: not, why: "on", or "off (...)"; empty for a runner that never shares.
    shared_prefix_in_batch: str = ""


@_frozen
class EmbeddingInfo:
    """What an embedding model gives: vectors of ``dims`` floats, pooled and L2-normalised."""

    dims: int
    #: How a row's hidden states become one vector: "last" (the last token's), "mean", "cls".
    pooling: str
    #: The model was trained so a prefix of the vector is itself an embedding (Matryoshka):
    #: only then may a request ask for fewer ``dimensions``.
    matryoshka: bool = False
    #: The prefixes it was trained for; empty: any length up to ``dims``.
    matryoshka_dimensions: tuple[int, ...] = ()


# -- engine facade -> ExecutorActor (jobs outside the scheduler's plans) -------------------


@_frozen
class EmbedJob:
    """Embed token rows on the MLX thread: the facade sends it on its clone of the plan
    channel (the executor's inbox). Each vector is pooled, cut to ``dimensions`` (None: all)
    and L2-normalised. Whoever holds the job owns ``reply`` and closes it; the answer is one
    :class:`EmbedReply`."""

    inputs: tuple[tuple[int, ...], ...]
    dimensions: int | None
    reply: trio.MemorySendChannel[EmbedReply]


@_frozen
class EmbedReply:
    """An :class:`EmbedJob`'s answer: one vector per input, in order, or the error."""

    vectors: tuple[tuple[float, ...], ...] = ()
    error: VllmMlxTrioError | None = None


#: What the executor receives: the scheduler's plans and hints, and the facade's jobs.
ExecutorMessage: TypeAlias = PlanMessage | EmbedJob


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


# -- engine facade -> SchedulerActor (departures) -----------------------------------------


@_frozen
class Departed:
    """A client closed its stream before the output ended: the scheduler drops the request
    before its next step, whether it is queued, prefilling or between two deliveries."""

    request_id: RequestId
