"""The engine facade: ``async with open_engine(cfg) as engine`` from any Trio program.

It wires the four actors in one nursery (one failure domain) and turns a request's outbox
into a stream of text deltas. It talks to the actors through the submit channel and each
request's outbox, and reads their ``statistics()``. Two operator actions are sync requests
to the scheduler instead of channel messages: ``clear_prefix_cache`` and ``fail_requests``
set a flag and wake its loop, which does the work between steps.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any, Protocol

import attrs
import trio

from .actors.admission import AdmissionActor, AdmissionLimits
from .actors.cache_manager import CacheManagerActor, CacheStatistics
from .actors.scheduler import SchedulerActor
from .actors.scheduler_stats import SchedulerStatistics
from .config import EngineConfig
from .core.params import SamplingParams
from .errors import EngineClosedError, QueueFullError, VllmMlxTrioError
from .health import EngineHealth, cancel_on_failure, run_supervised
from .messages import ChatMessage, ModelInfo, RequestId, StepPlan, StepResult, Submit
from .metrics import EngineMetrics, engine_snapshot
from .stream import Delta, RequestStream
from .worker.registry import runner_class

logger = logging.getLogger(__name__)

#: Buffer of the facade -> admission edge: a burst of submits waits here, never unbounded
#: because the admission semaphore caps requests in the engine.
SUBMIT_BUFFER = 16
#: Buffer of admission -> scheduler: the scheduler drains it every step.
ADMIT_BUFFER = 16
#: Buffer of a request's outbox. One slot is reserved for the final output; the rest let a
#: slightly slow consumer smooth jitter before its tokens start to be coalesced.
OUTBOX_BUFFER = 4
#: scheduler -> cache manager: releases are fire and forget; lookups, commits and clears wait
#: for their answer (one at a time, on a channel of 1).
CACHE_BUFFER = 8

PromptInput = str | list[dict[str, Any]] | tuple[ChatMessage, ...]


class ExecutorFactory(Protocol):
    """Builds the executor actor on the plan/result edge (the real one or a fake)."""

    def __call__(
        self,
        plan_recv: trio.MemoryReceiveChannel[StepPlan],
        result_send: trio.MemorySendChannel[StepResult],
    ) -> Any: ...


@attrs.frozen(kw_only=True)
class EngineStatistics:
    """A snapshot: requests inside the engine, and each actor's own statistics."""

    num_requests: int
    scheduler: SchedulerStatistics
    cache: CacheStatistics


def mlx_executor_factory(cfg: EngineConfig) -> ExecutorFactory:
    """The real executor: a dedicated MLX thread running the configured mode's runner."""

    def build(plan_recv, result_send):
        from .actors.executor import ExecutorActor

        Runner = runner_class(cfg.engine.mode)
        return ExecutorActor(
            plan_recv=plan_recv, result_send=result_send, runner_factory=lambda: Runner(cfg)
        )

    return build


def max_running(cfg: EngineConfig) -> int:
    """Sequences in the model at once, as the configured runner kind holds them."""
    return runner_class(cfg.engine.mode).max_running(cfg.engine)


@contextlib.asynccontextmanager
async def open_engine(
    cfg: EngineConfig, *, executor_factory: ExecutorFactory | None = None
) -> AsyncIterator[Engine]:
    """Load the model and run the actors; yields a ready :class:`Engine`.

    Leaving the block stops admissions and waits for the requests already inside to finish
    (cancel the surrounding scope to stop at once). If the executor fails, every request in
    the engine fails with the cause, new ones are refused (``engine.health``), and leaving the
    block raises the cause.
    """
    factory = executor_factory or mlx_executor_factory(cfg)
    async with trio.open_nursery() as nursery:
        engine = await Engine._start(cfg, nursery, factory)
        try:
            yield engine
        finally:
            engine._stop_admissions()
    if engine.health.error is not None:
        raise engine.health.error


class Engine:
    """Submit requests and read their outputs. Create it with :func:`open_engine`."""

    def __init__(self, cfg: EngineConfig, model_info: ModelInfo, submit_send, actors):
        self.cfg = cfg
        self.model_info = model_info
        self._submit_send: trio.MemorySendChannel[Submit] = submit_send
        self._scheduler: SchedulerActor = actors[0]
        self._cache: CacheManagerActor = actors[1]
        self.capacity = cfg.limits.max_waiting + max_running(cfg)
        self._slots = trio.Semaphore(self.capacity, max_value=self.capacity)
        self.metrics: EngineMetrics = actors[2]
        self.health: EngineHealth = actors[3]
        self.started_at = trio.current_time()
        #: Set when a shutdown begins: new requests are refused, the ones inside go on.
        self.draining = False
        self._ids = itertools.count()

    @classmethod
    async def _start(cls, cfg: EngineConfig, nursery: trio.Nursery, factory: ExecutorFactory):
        submit_send, submit_recv = trio.open_memory_channel[Submit](SUBMIT_BUFFER)
        admit_send, admit_recv = trio.open_memory_channel(ADMIT_BUFFER)
        in_flight = runner_class(cfg.engine.mode).plans_in_flight
        plan_send, plan_recv = trio.open_memory_channel(0)
        result_send, result_recv = trio.open_memory_channel(in_flight)
        cache_send, cache_recv = trio.open_memory_channel(CACHE_BUFFER)
        match_send, match_recv = trio.open_memory_channel(1)
        health = EngineHealth()
        executor = factory(plan_recv, result_send)
        stop_executor = trio.CancelScope()
        model_info: ModelInfo = await nursery.start(
            partial(run_supervised, executor.run, health, stop_executor)
        )
        cache = CacheManagerActor(command_recv=cache_recv, reply_send=match_send, cfg=cfg.cache)
        holder: list[Engine] = []
        metrics = EngineMetrics(
            cfg.model_name,
            model_info.max_context_tokens,
            lambda: engine_snapshot(holder[0].statistics()) if holder else {},
        )
        scheduler = SchedulerActor(
            admit_recv=admit_recv,
            plan_send=plan_send,
            result_recv=result_recv,
            cache_send=cache_send,
            match_recv=match_recv,
            eos_token_ids=model_info.eos_token_ids,
            max_running=max_running(cfg),
            plans_in_flight=in_flight,
            stream_interval=cfg.engine.stream_interval,
            metrics=metrics,
            health=health,
            stall_timeout_s=cfg.limits.engine_stall_timeout_s,
            kv_budget_tokens=model_info.kv_budget_tokens,
        )
        admission = AdmissionActor(
            submit_recv=submit_recv,
            admit_send=admit_send,
            tokenizer=model_info.tokenizer,
            limits=AdmissionLimits(
                max_context_tokens=model_info.max_context_tokens,
                kv_budget_tokens=model_info.kv_budget_tokens,
                default_max_tokens=cfg.engine.default_max_tokens,
                max_stop_sequences=cfg.limits.max_stop_sequences,
                vocab_size=model_info.vocab_size,
            ),
            preprocess_threads=cfg.limits.preprocess_threads,
        )
        nursery.start_soon(cancel_on_failure, health, stop_executor)
        await nursery.start(cache.run)
        await nursery.start(scheduler.run)
        await nursery.start(admission.run)
        engine = cls(cfg, model_info, submit_send, (scheduler, cache, metrics, health))
        holder.append(engine)
        return engine

    def _stop_admissions(self) -> None:
        self._submit_send.close()

    def start_draining(self) -> None:
        """Refuse new requests from now on (503); the ones inside go on. ``serve`` calls it
        when a shutdown begins."""
        self.draining = True

    def fail_requests(self, error: VllmMlxTrioError) -> None:
        """Fail every request in the engine now with ``error`` (their streams raise it); new
        requests are still accepted. ``serve`` calls it at the drain deadline."""
        self._scheduler.fail_all(error)

    async def clear_prefix_cache(self) -> int:
        """Drop every cached prefix block no running request holds; return how many."""
        request = self._scheduler.request_cache_clear()
        await request.done.wait()
        if request.closed:
            raise EngineClosedError("The engine stopped before the cache was cleared.")
        return request.num_dropped

    @property
    def num_requests(self) -> int:
        """Requests inside the engine (admitted, queued or running, streams not yet closed)."""
        return self.capacity - self._slots.value

    def statistics(self) -> EngineStatistics:
        return EngineStatistics(
            num_requests=self.num_requests,
            scheduler=self._scheduler.statistics(),
            cache=self._cache.statistics(),
        )

    async def submit(
        self,
        prompt: PromptInput,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
    ) -> RequestStream:
        """Admit a request and return its open :class:`RequestStream`.

        Raises :class:`QueueFullError` at once when the engine is full (the request is never
        tokenized), and the request's :class:`InvalidRequestError` when admission refuses it.
        The caller must close the stream (``with stream:``); closing it, however early, aborts
        the request and frees its resources before the scheduler's next step.
        """
        if self.health.error is not None:
            raise EngineClosedError(f"The engine has failed: {self.health.error}")
        if self.draining:
            raise EngineClosedError("The server is shutting down; not accepting new requests.")
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            raise QueueFullError(
                f"The engine is full ({self.capacity} requests running or waiting); retry later."
            ) from None
        params = params or SamplingParams()
        outbox_send, outbox_recv = trio.open_memory_channel(OUTBOX_BUFFER)
        rid = RequestId(request_id or f"req-{uuid.uuid4().hex[:16]}-{next(self._ids)}")
        stream = RequestStream(
            rid,
            outbox_recv,
            self.model_info.tokenizer,
            params.stop,
            token_bytes=self.model_info.token_bytes,
            on_close=self._slots.release,
            timer=self.metrics.request_timer(trio.current_time()),
        )
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
                    )
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                outbox_send.close()
                raise EngineClosedError("The engine is not accepting requests.") from None
            await stream.wait_accepted()
            on_error.pop_all()
        return stream

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


def _as_prompt(prompt: PromptInput) -> str | tuple[ChatMessage, ...]:
    """Chat turns as ChatMessages; a dict's ``content`` may be a string (one text part) or
    content parts already built (TextPart, ImagePart...)."""
    if isinstance(prompt, str):
        return prompt
    return tuple(
        m if isinstance(m, ChatMessage) else ChatMessage(role=m["role"], content=m["content"], name=m.get("name"))
        for m in prompt
    )
