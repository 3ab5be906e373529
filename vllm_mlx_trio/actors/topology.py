"""The engine's wiring: every channel between the actors, the nursery they run in, and the
executor's supervision. :class:`~vllm_mlx_trio.engine.Engine` (the facade) only holds the
outside ends that :func:`open_topology` yields.

```
facade ──Submit──► admission ──Admit──► scheduler ◄──StepPlan/StepResult──► executor (MLX thread)
facade ──FailAll / ClearPrefixCache──►      ▲ │
facade ──Departed (a stream closed early)──►│ │
                              cache manager ┘ ▼ (PrefixLookup / Commit / Release / Clear)
```

The runner kind (``engine.mode``, looked up in the runner table the engine was given) decides
facts of the wiring through its shape: how many plans may be in flight on the executor edge,
how many tokens a step may give a sequence, and how many sequences run at once.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any, Protocol

import attrs
import trio

from ..config import EngineConfig
from ..errors import ExecutorCrashedError, ModelLoadError, VllmMlxTrioError
from ..health import EngineFailed, EngineHealth
from ..messages import Admit, ControlCommand, Departed, EmbedJob, ModelInfo, StepPlan, StepResult, Submit
from ..metrics import EngineMetrics, engine_snapshot
from ..output_format import OutputFormat, resolve_output_format
from ..runner_kinds import RunnerShape
from ..worker.registry import RUNNERS, RunnerTable, runner_for
from .admission.actor import AdmissionActor, AdmissionLimits
from .admission.media import make_media_loader
from .prefix.cache_manager import CacheManagerActor
from .prefix.kv_events import kv_event_sink
from .scheduler.actor import SchedulerActor
from .scheduler.settings import SchedulerSettings, max_outstanding

logger = logging.getLogger(__name__)

#: Buffer of the facade -> admission edge: a burst of submits waits here, never unbounded
#: because the admission semaphore caps requests in the engine.
SUBMIT_BUFFER = 16
#: Buffer of admission -> scheduler: the scheduler drains it every step.
ADMIT_BUFFER = 16
#: scheduler -> cache manager: releases are fire and forget; lookups, commits and clears wait
#: for their answer (one at a time, on a channel of 1).
CACHE_BUFFER = 8
#: facade -> scheduler (operator actions). They are rare: a drain's ``FailAll``, and prefix
#: cache clears, one at a time (the facade serialises them). The scheduler's control task
#: moves each command to its loop as soon as it arrives, so this only absorbs the commands
#: sent between two of its turns; ``Engine.fail_requests`` (sync) never has to wait.
CONTROL_BUFFER = 8


class ExecutorFactory(Protocol):
    """Builds the executor actor on the plan/result edge (the real one or a fake)."""

    def __call__(
        self,
        plan_recv: trio.MemoryReceiveChannel[StepPlan],
        result_send: trio.MemorySendChannel[StepResult],
    ) -> Any: ...


def mlx_executor_factory(cfg: EngineConfig, runners: RunnerTable = RUNNERS) -> ExecutorFactory:
    """The real executor: a dedicated MLX thread running the configured mode's runner from ``runners``."""

    def build(plan_recv, result_send):
        from .executor import ExecutorActor

        Runner = runner_for(cfg, runners)
        return ExecutorActor(
            plan_recv=plan_recv,
            result_send=result_send,
            runner_factory=lambda request_waiting: Runner(cfg, request_waiting=request_waiting),
        )

    return build


def max_running(cfg: EngineConfig, runners: RunnerTable = RUNNERS) -> int:
    """Sequences in the model at once, as the configured runner kind holds them."""
    return runner_for(cfg, runners).shape(cfg).max_running


@attrs.frozen(kw_only=True)
class Topology:
    """The running engine seen from outside: the facade's channel ends (owned and closed by
    :func:`open_topology`), the actors it reads statistics from, metrics and health."""

    model_info: ModelInfo
    submit_send: trio.MemorySendChannel[Submit]
    control_send: trio.MemorySendChannel[ControlCommand]
    #: Streams closed before their output ended tell the scheduler here.
    depart_send: trio.MemorySendChannel[Departed]
    #: The facade's clone of the plan channel: jobs (an embedding model's) straight to the
    #: executor's inbox, beside the scheduler's plans.
    job_send: trio.MemorySendChannel[EmbedJob]
    scheduler: SchedulerActor
    cache: CacheManagerActor
    metrics: EngineMetrics
    health: EngineHealth
    max_running: int
    #: The tool / reasoning parsers chat replies go through (resolved from the config and the
    #: model's chat template once it is loaded).
    output_format: OutputFormat = OutputFormat()


@contextlib.asynccontextmanager
async def open_topology(
    cfg: EngineConfig, factory: ExecutorFactory, runners: RunnerTable = RUNNERS
) -> AsyncIterator[Topology]:
    """Load the model and run the four actors in one nursery (one failure domain); the scheduler
    drives the configured kind of ``runners`` as its shape says.

    Leaving the block closes the submit, control and departure channels: admission stops, and the
    scheduler finishes the requests already inside before the actors return. If the executor
    failed meanwhile, leaving the block raises its cause.
    """
    shape = runner_for(cfg, runners).shape(cfg)
    async with trio.open_nursery() as nursery:
        topology = await _start(cfg, nursery, factory, shape)
        with topology.submit_send, topology.control_send, topology.depart_send, topology.job_send:
            yield topology
    error = topology.health.snapshot().error
    if error is not None:
        raise error


async def _start(cfg: EngineConfig, nursery: trio.Nursery, factory: ExecutorFactory, shape: RunnerShape) -> Topology:
    in_flight, running = shape.plans_in_flight, shape.max_running
    submit_send, submit_recv = trio.open_memory_channel[Submit](SUBMIT_BUFFER)
    control_send, control_recv = trio.open_memory_channel[ControlCommand](CONTROL_BUFFER)
    admit_send, admit_recv = trio.open_memory_channel(ADMIT_BUFFER)
    plan_send, plan_recv = trio.open_memory_channel(0)
    job_send = plan_send.clone()  # the facade's, closed with its other ends
    result_send, result_recv = trio.open_memory_channel(max_outstanding(in_flight, running) * shape.results_per_plan)
    cache_send, cache_recv = trio.open_memory_channel(CACHE_BUFFER)
    match_send, match_recv = trio.open_memory_channel(1)
    # One slot per request the engine holds at once (each departs once); a departure that
    # finds it full is noticed later, by the failed send of the request's next output.
    depart_send, depart_recv = trio.open_memory_channel[Departed](cfg.limits.max_waiting + running)
    health = EngineHealth()
    model_info = capped_context(await _start_executor(nursery, factory(plan_recv, result_send), health), cfg)
    cache = CacheManagerActor(
        command_recv=cache_recv,
        reply_send=match_send,
        cfg=cfg.cache,
        kv_events=kv_event_sink(cfg.cache.kv_events_endpoint),
    )
    metrics = EngineMetrics(cfg.model_name, model_info.max_context_tokens)
    scheduler = _scheduler(
        cfg,
        model_info,
        shape,
        metrics,
        health,
        admit_recv=admit_recv,
        control_recv=control_recv,
        depart_recv=depart_recv,
        plan_send=plan_send,
        result_recv=result_recv,
        cache_send=cache_send,
        match_recv=match_recv,
    )
    # Without a KV budget only the context length bounds the running KV.
    kv_capacity = model_info.kv_budget_tokens or running * model_info.max_context_tokens
    metrics.read_gauges_from(
        lambda: engine_snapshot(scheduler.statistics(), cache.statistics(), kv_capacity_tokens=kv_capacity)
    )
    await nursery.start(cache.run)
    await nursery.start(scheduler.run)
    output_format = resolve_output_format(cfg.model, model_info.tokenizer)
    admission = _admission(cfg, model_info, submit_recv, admit_send, output_format, metrics)
    await nursery.start(admission.run)
    return Topology(
        model_info=model_info,
        submit_send=submit_send,
        control_send=control_send,
        depart_send=depart_send,
        job_send=job_send,
        scheduler=scheduler,
        cache=cache,
        metrics=metrics,
        health=health,
        max_running=running,
        output_format=output_format,
    )


def capped_context(model_info: ModelInfo, cfg: EngineConfig) -> ModelInfo:
    """The loaded model's facts with its context capped at ``model.max_model_len`` (vLLM's
    ``--max-model-len``): every limit, ``/v1/models`` and the metrics read the capped value.
    A cap above the model's own context is refused, as vLLM refuses it."""
    cap = cfg.model.max_model_len
    if cap is None:
        return model_info
    if cap > model_info.max_context_tokens:
        raise ModelLoadError(
            f"model.max_model_len ({cap}) is greater than the model's own context length "
            f"({model_info.max_context_tokens} tokens, from its config); set it to at most that"
        )
    return attrs.evolve(model_info, max_context_tokens=cap)


async def _start_executor(nursery: trio.Nursery, executor: Any, health: EngineHealth) -> ModelInfo:
    """Start the executor supervised (its failure goes to ``health``), and stop it when the
    engine fails for another reason; the loaded model's facts come back."""
    stop_executor, exited = trio.CancelScope(), trio.Event()
    model_info = await nursery.start(partial(run_supervised, executor.run, health, stop_executor, exited))
    nursery.start_soon(cancel_on_failure, health, stop_executor, exited)
    return model_info


def _scheduler(
    cfg: EngineConfig,
    model_info: ModelInfo,
    shape: RunnerShape,
    metrics: EngineMetrics,
    health: EngineHealth,
    **channels: Any,
) -> SchedulerActor:
    """The scheduler for a runner of ``shape`` (its plans in flight, tokens per step and running limit) over
    ``channels``."""
    settings = SchedulerSettings(
        eos_token_ids=model_info.eos_token_ids,
        max_running=shape.max_running,
        plans_in_flight=shape.plans_in_flight,
        max_tokens_per_step=shape.max_tokens_per_step,
        stream_interval=cfg.engine.stream_interval,
        stall_timeout_s=cfg.limits.engine_stall_timeout_s,
        kv_budget_tokens=model_info.kv_budget_tokens,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        prefill_chunk_tokens=cfg.engine.prefill_step_size,
        prefill_chunk_decoding_tokens=cfg.engine.prefill_step_size_decoding,
        shared_prefix=(
            (cfg.cache.block_size, cfg.cache.share_prefix_min_tokens)
            if model_info.shared_prefix_in_batch == "on"
            else None
        ),
    )
    return SchedulerActor(**channels, settings=settings, metrics=metrics, health=health)


def _admission(
    cfg: EngineConfig,
    model_info: ModelInfo,
    submit_recv: trio.MemoryReceiveChannel[Submit],
    admit_send: trio.MemorySendChannel[Admit],
    output_format: OutputFormat,
    metrics: EngineMetrics,
) -> AdmissionActor:
    return AdmissionActor(
        submit_recv=submit_recv,
        admit_send=admit_send,
        tokenizer=model_info.tokenizer,
        limits=AdmissionLimits(
            max_context_tokens=model_info.max_context_tokens,
            kv_budget_tokens=model_info.kv_budget_tokens,
            default_max_tokens=cfg.engine.default_max_tokens,
            max_stop_sequences=cfg.limits.max_stop_sequences,
            vocab_size=model_info.vocab_size,
            media_kinds=model_info.media_kinds,
            text_only_note=model_info.text_only_note,
            tool_media_placeholders=cfg.limits.tool_result_media == "placeholder",
            generates=model_info.embedding is None,
            clamp_max_tokens=cfg.limits.clamp_max_tokens,
            adapters=frozenset(name for name, _ in cfg.model.adapters),
        ),
        preprocess_threads=cfg.limits.preprocess_threads,
        output_format=output_format,
        # a VLM's media step (actors/admission/media.py)
        media_loader=make_media_loader(cfg.mllm) if model_info.media_processor is not None else None,
        media_processor=model_info.media_processor,
        on_media=lambda media: metrics.on_media_loaded(media.loaded),  # a VLM's images / videos
    )


# -- supervision: the executor's failure becomes the engine's health -------------------------


class _StartedReporter:
    """A ``task_status`` that remembers whether ``started`` was called."""

    def __init__(self, task_status: trio.TaskStatus[Any]):
        self._task_status = task_status
        self.started_once = False

    def started(self, value: Any = None) -> None:
        self.started_once = True
        self._task_status.started(value)


async def run_supervised(
    run: Callable[..., Awaitable[None]],
    health: EngineHealth,
    stop: trio.CancelScope,
    exited: trio.Event,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an actor; once it has started, its failure is reported to ``health`` instead of
    cancelling its siblings (a failure while starting, such as a model that cannot load,
    still raises at once). ``stop`` is cancelled when a failure is reported elsewhere (the
    scheduler's watchdog), which stops the actor too: see :func:`cancel_on_failure`.
    ``exited`` is set when the actor has returned, either way.

    The failure is reported before anything else runs (no checkpoint between the actor's
    exit and the ``except``), so every request fails with the actor's own cause.
    """
    reporter = _StartedReporter(task_status)
    try:
        with stop:
            await run(task_status=reporter)
    except Exception as exc:  # boundary: a running actor's failure becomes the engine's
        if not reporter.started_once:
            raise
        health.report(EngineFailed(error=_our_error(exc)))
    finally:
        exited.set()


async def cancel_on_failure(health: EngineHealth, stop: trio.CancelScope, exited: trio.Event) -> None:
    """Cancel ``stop`` if the engine fails; return once the executor has ``exited`` either
    way (run in the engine's nursery)."""
    async with trio.open_nursery() as nursery:

        async def on_failure() -> None:
            await health.wait_failed()
            stop.cancel()

        nursery.start_soon(on_failure)
        await exited.wait()
        nursery.cancel_scope.cancel()


def _our_error(exc: BaseException) -> VllmMlxTrioError:
    """The first of our errors in ``exc`` (Trio wraps task failures in groups), else a
    translation of ``exc`` into an :class:`ExecutorCrashedError`."""
    if isinstance(exc, VllmMlxTrioError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _our_error(inner)
            if not (type(found) is ExecutorCrashedError and found.__cause__ is inner):
                return found
        return _our_error(exc.exceptions[0])
    error = ExecutorCrashedError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
