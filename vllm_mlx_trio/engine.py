"""The engine facade: ``async with open_engine(cfg) as engine`` from any Trio program.

It holds the outside ends of the actors' wiring (``actors/topology.py``): it turns a
request into a ``Submit`` on the submit channel and the request's outbox into a stream of
text deltas, sends operator actions (``fail_requests``, ``clear_prefix_cache``) as commands
on the control channel, an embedding model's rows (``embed``) as jobs straight to the
executor, and reads the actors' ``statistics()``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio

from .actors.prefix.cache_manager import CacheStatistics
from .actors.scheduler.stats import SchedulerStatistics
from .actors.topology import ExecutorFactory, Topology, max_running, mlx_executor_factory, open_topology
from .config import EngineConfig
from .core.params import SamplingParams
from .core.prefix.pool_types import BlockInfo
from .core.prefix.warm_prompts import warm_prefix_cache
from .core.text import keeping_special_markup, with_special_markup
from .errors import EngineClosedError, QueueFullError, VllmMlxTrioError
from .health import DrainStarted, HealthSnapshot
from .messages import (
    ChatMessage,
    ChatPrompt,
    ClearPrefixCache,
    Departed,
    EmbedJob,
    EmbedReply,
    FailAll,
    ModelInfo,
    RequestId,
    Submit,
)
from .output_format import OutputFormat
from .stream import Delta, RequestStream
from .worker.registry import RUNNERS, RunnerTable

__all__ = ["Engine", "EngineStatistics", "ExecutorFactory", "max_running", "mlx_executor_factory", "open_engine"]

logger = logging.getLogger(__name__)

#: Buffer of a request's outbox. One slot is reserved for the final output; the rest let a
#: slightly slow consumer smooth jitter before its tokens start to be coalesced.
OUTBOX_BUFFER = 4

PromptInput = str | list[dict[str, Any]] | tuple[ChatMessage, ...] | ChatPrompt


@attrs.frozen(kw_only=True)
class EngineStatistics:
    """A snapshot: requests inside the engine, and each actor's own statistics."""

    num_requests: int
    scheduler: SchedulerStatistics
    cache: CacheStatistics


@contextlib.asynccontextmanager
async def open_engine(
    cfg: EngineConfig, *, executor_factory: ExecutorFactory | None = None, runners: RunnerTable = RUNNERS
) -> AsyncIterator[Engine]:
    """Load the model and run the actors; yields a ready :class:`Engine` (with
    ``cache.warm_prompts_file``, once its prompts are in the prefix cache).

    ``runners``: the runner kinds ``engine.mode`` may name (worker/registry.py's ``RUNNERS``, or a
    table of the program's own, e.g. ``with_runner("mine", MyRunner)``).

    Leaving the block stops admissions and waits for the requests already inside to finish
    (cancel the surrounding scope to stop at once). If the executor fails, every request in
    the engine fails with the cause, new ones are refused (``engine.health``), and leaving the
    block raises the cause.
    """
    factory = executor_factory or mlx_executor_factory(cfg, runners)
    async with open_topology(cfg, factory, runners) as topology:
        engine = Engine(cfg, topology)
        if cfg.cache.warm_prompts_file is not None and cfg.cache.enabled:
            await warm_prefix_cache(engine, cfg.cache.warm_prompts_file)
        yield engine


class Engine:
    """Submit requests and read their outputs. Create it with :func:`open_engine`."""

    def __init__(self, cfg: EngineConfig, topology: Topology):
        self.cfg = cfg
        self.model_info = topology.model_info
        #: The tool and reasoning parsers chat replies go through, resolved at load from
        #: ``[model] tool_parser`` / ``reasoning_parser`` and the chat template.
        self.output_format = topology.output_format
        #: Chat replies keep the parsers' markup that the tokenizer has as special tokens.
        self._chat_token_bytes = _chat_token_bytes(self.model_info, self.output_format)
        self._chat_decoder = _chat_decoder(self.model_info, self.output_format)
        self._submit_send = topology.submit_send
        self._control_send = topology.control_send
        self._depart_send = topology.depart_send
        self._job_send = topology.job_send
        self._scheduler = topology.scheduler
        self._cache = topology.cache
        self.metrics = topology.metrics
        self._health = topology.health
        self.capacity = cfg.limits.max_waiting + topology.max_running
        self._slots = trio.Semaphore(self.capacity, max_value=self.capacity)
        #: Set whenever the last request inside has left; replaced when a waiter needs a new one.
        self._empty = trio.Event()
        self._empty.set()
        #: Cache clears go one at a time, so at most one is queued on the control channel.
        self._clear_lock = trio.Lock()
        self.started_at = trio.current_time()
        self._ids = itertools.count()

    @property
    def health(self) -> HealthSnapshot:
        """The engine's health now: its failure, if any, and whether a drain has begun."""
        return self._health.snapshot()

    @property
    def draining(self) -> bool:
        """Whether a shutdown has begun: new requests are refused, the ones inside go on."""
        return self.health.draining

    async def wait_failed(self) -> VllmMlxTrioError:
        """Wait until the engine fails; the cause."""
        return await self._health.wait_failed()

    def start_draining(self) -> None:
        """Refuse new requests from now on (503); the ones inside go on. ``serve`` calls it
        when a shutdown begins."""
        self._health.report(DrainStarted())

    def fail_requests(self, error: VllmMlxTrioError) -> None:
        """Fail every request in the engine now with ``error`` (their streams raise it); new
        requests are still accepted. ``serve`` calls it at the drain deadline.

        A :class:`~vllm_mlx_trio.messages.FailAll` command to the scheduler, which acts on it
        between two steps. Should the control channel be full, the commands ahead of this one
        are failures not yet acted on, which will fail everything held by then: this one adds
        nothing and is dropped."""
        try:
            self._control_send.send_nowait(FailAll(error=error))
        except trio.WouldBlock:
            logger.warning("fail_requests: the control channel is full of failures not acted on yet; they cover it")
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the scheduler has stopped: no request is left to fail

    async def clear_prefix_cache(self) -> int:
        """Drop every cached prefix block no running request holds; return how many."""
        reply_send, reply_recv = trio.open_memory_channel[int](1)
        closed = EngineClosedError("The engine stopped before the cache was cleared.")
        with reply_recv:
            async with self._clear_lock:
                handed_over = False
                try:
                    await self._control_send.send(ClearPrefixCache(reply=reply_send))
                    handed_over = True  # the scheduler owns the reply channel from here
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise closed from None
                finally:
                    if not handed_over:
                        reply_send.close()
                try:
                    return await reply_recv.receive()
                except trio.EndOfChannel:
                    raise closed from None

    @property
    def num_requests(self) -> int:
        """Requests inside the engine (admitted, queued or running, streams not yet closed)."""
        return self.capacity - self._slots.value

    async def wait_empty(self) -> None:
        """Return once no request is inside the engine (at once when none is). Woken by the
        last stream's close, never by polling."""
        while self.num_requests:
            if self._empty.is_set():
                self._empty = trio.Event()
            await self._empty.wait()

    def _stream_closed(self, request_id: RequestId, ended: bool) -> None:
        """A stream's close: the scheduler hears of a client that left before the end (it drops
        the request before its next step), and the request's slot is free again."""
        if not ended:
            try:
                self._depart_send.send_nowait(Departed(request_id=request_id))
            except trio.WouldBlock:
                pass  # the scheduler still notices it, when a send to the closed outbox fails
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the scheduler has stopped: nothing is left to drop
        self._slots.release()
        if not self.num_requests:
            self._empty.set()

    def holds_request(self, request_id: str) -> bool:
        """Whether a request with this id is still in the scheduler (queued or running): a set
        lookup, no snapshot built and no queue scanned (HTTP checks every new request's id)."""
        return self._scheduler.holds(request_id)

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            num_requests=self.num_requests,
            scheduler=self._scheduler.statistics(),
            cache=self._cache.statistics(),
        )

    def prefix_blocks(self) -> tuple[BlockInfo, ...]:
        """A snapshot of every block in the prefix cache, by id: its bytes, whether it is a tail,
        how many requests lease it (O(blocks): for benchmarks and tests)."""
        return self._cache.blocks()

    async def submit(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        endpoint: str = "",
    ) -> RequestStream:
        """Admit a request and return its open :class:`RequestStream`.

        ``endpoint``: the HTTP route it came from, the ``endpoint`` label of its metrics ("" for none).

        Raises :class:`QueueFullError` at once when the engine is full (the request is never
        tokenized), and the request's :class:`InvalidRequestError` when admission refuses it.
        The caller must close the stream (``with stream:``); closing it, however early, aborts
        the request and frees its resources before the scheduler's next step.
        """
        self._take_slot()
        params = params or SamplingParams()
        outbox_send, outbox_recv = trio.open_memory_channel(OUTBOX_BUFFER)
        rid = RequestId(request_id or f"req-{uuid.uuid4().hex[:16]}-{next(self._ids)}")
        stream = self._open_stream(rid, prompt, params, outbox_recv, endpoint)
        with contextlib.ExitStack() as on_error:
            on_error.callback(stream.close)
            try:
                await self._submit_send.send(
                    Submit(
                        request_id=rid,
                        prompt=_as_prompt(prompt),
                        params=params,
                        outbox=outbox_send,
                        arrival_time=trio.current_time(),
                        endpoint=endpoint,
                    )
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                outbox_send.close()
                raise EngineClosedError("The engine is not accepting requests.") from None
            await stream.wait_accepted()
            on_error.pop_all()
        return stream

    async def embed(
        self, inputs: Sequence[Sequence[int]], *, dimensions: int | None = None
    ) -> tuple[tuple[float, ...], ...]:
        """One L2-normalised vector per row of token ids (an embedding model's, engine.mode =
        "embed"), cut to ``dimensions`` first when given; the rows go to the MLX thread as one
        job, batched there with the jobs queued beside it.

        Takes one of the engine's request slots while it runs (:class:`QueueFullError` when
        none is free). Raises the job's error (an :class:`InvalidRequestError` on a model
        that does not embed), or :class:`EngineClosedError` when the engine stops first.
        """
        self._take_slot()
        try:
            job_reply, replies = trio.open_memory_channel[EmbedReply](1)
            job = EmbedJob(inputs=tuple(tuple(row) for row in inputs), dimensions=dimensions, reply=job_reply)
            with replies:
                await self._hand_over(job)
                try:
                    reply = await replies.receive()
                except trio.EndOfChannel:
                    raise EngineClosedError("The engine stopped before the embedding was computed.") from None
        finally:
            self._slots.release()
            if not self.num_requests:
                self._empty.set()
        if reply.error is not None:
            raise reply.error
        return reply.vectors

    async def _hand_over(self, job: EmbedJob) -> None:
        """Send ``job`` to the executor; its reply channel is the executor's once sent, and
        closed here otherwise."""
        with contextlib.ExitStack() as unsent:
            unsent.callback(job.reply.close)
            try:
                await self._job_send.send(job)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise EngineClosedError("The engine is not accepting requests.") from None
            unsent.pop_all()

    def _take_slot(self) -> None:
        """One of the engine's request slots, or the error that says why there is none."""
        health = self.health
        if health.error is not None:
            raise EngineClosedError(f"The engine has failed: {health.error}")
        if health.draining:
            raise EngineClosedError("The server is shutting down; not accepting new requests.")
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            raise QueueFullError(
                f"The engine is full ({self.capacity} requests running or waiting); retry later."
            ) from None

    def _open_stream(
        self,
        rid: RequestId,
        prompt: PromptInput,
        params: SamplingParams,
        outbox_recv: trio.MemoryReceiveChannel,
        endpoint: str,
    ) -> RequestStream:
        """The caller's side of a request: it detokenizes and stops as ``params`` say, and frees
        the slot when closed."""
        return RequestStream(
            rid,
            outbox_recv,
            self.model_info.tokenizer if isinstance(prompt, str) else self._chat_decoder,
            params.stop,
            token_bytes=self.model_info.token_bytes if isinstance(prompt, str) else self._chat_token_bytes,
            on_close=functools.partial(self._stream_closed, rid),
            timer=self.metrics.request_timer(trio.current_time(), endpoint),
            min_tokens=params.min_tokens,
            include_stop=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
        )

    @contextlib.asynccontextmanager
    async def open_request(
        self, prompt: PromptInput, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> AsyncIterator[RequestStream]:
        """:meth:`submit` as a context manager: leaving the block closes (aborts) the stream."""
        with await self.submit(prompt, params, request_id=request_id) as stream:
            yield stream

    async def generate(
        self, prompt: PromptInput, params: SamplingParams | None = None, *, request_id: str | None = None
    ) -> AsyncIterator[Delta]:
        """Yield the request's text deltas; the last one carries ``finish_reason``.

        Breaking out of the loop, cancelling, or raising in the loop body aborts the request.
        """
        with await self.submit(prompt, params, request_id=request_id) as stream:
            async for delta in stream:
                yield delta


def _as_prompt(prompt: PromptInput) -> str | ChatPrompt:
    """Chat turns as a :class:`ChatPrompt` (one given is kept: it carries tools and template
    kwargs); a dict's ``content`` may be a string (one text part), content parts already
    built (TextPart, ImagePart...) or None, and it may carry OpenAI-shaped ``tool_calls`` and
    a ``tool_call_id``."""
    if isinstance(prompt, str | ChatPrompt):
        return prompt
    return ChatPrompt(messages=[m if isinstance(m, ChatMessage) else _as_message(m) for m in prompt])


def _as_message(turn: dict[str, Any]) -> ChatMessage:
    return ChatMessage(
        role=turn["role"],
        content=turn.get("content"),
        name=turn.get("name"),
        tool_calls=turn.get("tool_calls"),
        tool_call_id=turn.get("tool_call_id"),
        reasoning=turn.get("reasoning_content", turn.get("reasoning")),
    )


def _chat_decoder(model_info: ModelInfo, output_format: OutputFormat) -> Any:
    """The decoder of chat replies when the tokenizer has no byte table (SentencePiece): the
    tokenizer's, with the output parsers' markup kept where it is a special token."""
    if model_info.token_bytes is not None or not output_format.markup:
        return model_info.tokenizer
    return keeping_special_markup(model_info.tokenizer, output_format.markup)


def _chat_token_bytes(model_info: ModelInfo, output_format: OutputFormat) -> tuple[bytes, ...] | None:
    """The byte table chat replies are detokenized with: the model's, with the output parsers'
    markup kept where the tokenizer has it as special tokens (otherwise the parsers never see it)."""
    if model_info.token_bytes is None or not output_format.markup:
        return model_info.token_bytes
    return with_special_markup(model_info.token_bytes, model_info.tokenizer, output_format.markup)
