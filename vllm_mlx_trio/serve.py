"""``serve(cfg)``: the engine plus Hypercorn in one nursery, embeddable in any Trio program."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import hypercorn
import hypercorn.trio
import trio

from .config import EngineConfig
from .engine import Engine, ExecutorFactory, max_running, open_engine
from .errors import EngineClosedError
from .http.app import create_app
from .http.auth import ApiKeys, load_api_keys
from .http.cors import CorsPolicy
from .http.direct_send import use_direct_send
from .http.loading_app import create_loading_app
from .http.ops_routes import ThroughputMeter
from .logs import configure_logging, logfmt_value

logger = logging.getLogger(__name__)

#: After the engine fails, keep answering this long (503 on /health and on new requests,
#: open streams get their in-band error) so health checks and clients see why, then drain.
FAILURE_LINGER_S = 2.0
#: The loading app's answers are immediate: this is only for a reply still being written.
LOADING_GRACE_S = 1.0
#: How long before the drain deadline the remaining requests get their in-band error, so the
#: error event is written before Hypercorn closes the connection.
DRAIN_ERROR_MARGIN_S = 1.0


def hypercorn_config(cfg: EngineConfig) -> hypercorn.Config:
    """Hypercorn's settings for ``cfg``; also picks the class of Hypercorn's connections
    (``server.direct_socket_writes``), which Hypercorn reads from its own module."""
    use_direct_send(cfg.server.direct_socket_writes)
    hc = hypercorn.Config()
    hc.bind = [f"{cfg.server.host}:{cfg.server.port}"]
    hc.backlog = cfg.server.backlog  # a burst of clients waits in the queue instead of being reset
    hc.graceful_timeout = cfg.server.drain_timeout_s  # in-flight streams get this long on stop
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    return hc


async def serve(
    cfg: EngineConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    executor_factory: ExecutorFactory | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model, then serve HTTP until ``shutdown_trigger`` returns (or cancellation).
    With ``[[models]]`` it serves those instead, loaded on demand (models/serve.py).

    ``started`` reports the bound URLs. After the trigger, Hypercorn stops accepting and gives
    in-flight responses ``server.drain_timeout_s`` to finish; then the engine stops.

    The API keys are read first: a bad ``server.api_key_file`` is a :class:`ConfigError`
    before anything binds or loads.
    """
    if cfg.models:
        from .models.serve import serve_models

        await serve_models(cfg, shutdown_trigger=shutdown_trigger, task_status=task_status)
        return
    api_keys = load_api_keys(cfg.server)
    if cfg.server.port == 0:  # an ephemeral port could not be kept across the two phases
        async with open_engine(cfg, executor_factory=executor_factory) as engine:
            await serve_engine(engine, api_keys=api_keys, shutdown_trigger=shutdown_trigger, task_status=task_status)
        return
    async with trio.open_nursery() as nursery:
        loaded = trio.Event()
        loading_done = await nursery.start(_serve_while_loading, cfg, api_keys, loaded)
        async with open_engine(cfg, executor_factory=executor_factory) as engine:
            loaded.set()
            await loading_done.wait()  # the loading app has let go of the port
            await serve_engine(engine, api_keys=api_keys, shutdown_trigger=shutdown_trigger, task_status=task_status)


async def _serve_while_loading(
    cfg: EngineConfig, api_keys: ApiKeys, loaded: trio.Event, *, task_status: trio.TaskStatus[trio.Event]
) -> None:
    """Answer 503 "loading" on the server's address until ``loaded`` is set."""
    done = trio.Event()
    loading_app = create_loading_app(api_keys, CorsPolicy(cfg.server.cors_origins))
    hc = hypercorn_config(cfg)
    hc.graceful_timeout = LOADING_GRACE_S
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(
                lambda task_status: hypercorn.trio.serve(
                    loading_app, hc, shutdown_trigger=loaded.wait, task_status=task_status
                )
            )
            logger.info("loading model %s", logfmt_value(cfg.model.path))
            task_status.started(done)
    finally:
        done.set()


async def serve_engine(
    engine: Engine,
    *,
    api_keys: ApiKeys | None = None,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an already open engine over HTTP (the engine's lifetime stays the caller's).

    ``api_keys`` defaults to those of ``server.api_key_file`` and ``$VLLM_MLX_TRIO_API_KEYS``.
    """
    cfg = engine.cfg
    throughput = ThroughputMeter.for_engine(engine)
    app = create_app(engine, cfg, throughput=throughput, api_keys=api_keys)
    shutdown_trigger = _drain_first(engine, _or_engine_failure(engine, shutdown_trigger))
    async with trio.open_nursery() as nursery:

        async def serve_http(task_status: trio.TaskStatus[list[str]]) -> None:
            hc = hypercorn_config(cfg)
            hc.graceful_timeout = DRAIN_ERROR_MARGIN_S  # the drain itself happened before
            await hypercorn.trio.serve(app, hc, shutdown_trigger=shutdown_trigger, task_status=task_status)
            nursery.cancel_scope.cancel()  # the server has stopped: so does the sampler

        nursery.start_soon(throughput.run)
        binds = await nursery.start(serve_http)
        logger.info("%s", startup_summary(engine, binds))
        task_status.started(binds)


def _or_engine_failure(engine: Engine, trigger: Callable[[], Awaitable[None]] | None) -> Callable[[], Awaitable[None]]:
    """Stop serving when ``trigger`` returns or the engine fails, whichever comes first."""

    async def either() -> None:
        async with trio.open_nursery() as nursery:

            async def first(wait: Callable[[], Awaitable[None]]) -> None:
                await wait()
                nursery.cancel_scope.cancel()

            async def failed() -> None:
                await engine.wait_failed()
                await trio.sleep(FAILURE_LINGER_S)

            if trigger is not None:
                nursery.start_soon(first, trigger)
            nursery.start_soon(first, failed)

    return either


def _drain_first(engine: Engine, trigger: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """After ``trigger``: refuse new requests (503, ``/health`` "draining") while the ones
    inside finish, up to ``server.drain_timeout_s``; fail what is left with an in-band error
    just before the deadline; then let Hypercorn close the connections."""

    async def drain() -> None:
        await trigger()
        if not engine.health.ok:
            return  # the engine failed: its requests have their error already
        engine.start_draining()
        drain_s = engine.cfg.server.drain_timeout_s
        with trio.move_on_after(max(0.0, drain_s - min(DRAIN_ERROR_MARGIN_S, drain_s / 2))):
            await engine.wait_empty()  # woken when the last request's stream closes
        if engine.num_requests:
            engine.fail_requests(EngineClosedError("The server is shutting down; the request was not finished."))

    return drain


def startup_summary(engine: Engine, binds: list[str]) -> str:
    """The one line logged when the server is ready."""
    cfg = engine.cfg
    mode = engine.model_info.runner_kind or cfg.engine.mode  # what "auto" chose, when it chose
    return (
        f"ready: model={logfmt_value(cfg.model_name)} mode={mode}{speculative_label(cfg)} "
        f"max_num_seqs={max_running(cfg)} kv_budget_tokens={engine.model_info.kv_budget_tokens} "
        f"{_cache_budget(engine)} listening={','.join(binds)}"
    )


def speculative_label(cfg) -> str:
    """`` speculative=METHOD`` when speculative decoding is on (the runner in place of batched)."""
    method = cfg.speculative.method
    return "" if method == "off" else f" speculative={method}"


def _cache_budget(engine: Engine) -> str:
    """The prefix cache's budget: ``prefix_cache_bytes=N``, ``prefix_cache_blocks=N`` or off."""
    cache = engine.statistics().cache
    if not cache.enabled:
        return "prefix_cache=off"
    if cache.pool.max_bytes is not None:
        return f"prefix_cache_bytes={cache.pool.max_bytes}"
    return f"prefix_cache_blocks={cache.pool.max_blocks}"


async def serve_until_signalled(cfg: EngineConfig) -> int | None:
    """``serve`` with SIGINT/SIGTERM as the shutdown trigger; a second signal stops at once.

    The server's entry point: it also sets up the root logger from ``cfg.logging`` (level
    and format), replacing any handler configured before. Returns None after a drain, or
    the number of the second signal that cut it short (a model step may then still be
    running on the abandoned MLX thread: the caller should exit without finalizing).
    """
    configure_logging(cfg.logging)
    forced_by: list[int] = []
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        first_signal = trio.Event()

        async def shutdown_trigger() -> None:
            await first_signal.wait()

        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    if first_signal.is_set():
                        logger.warning("second %s: stopping now", signal.Signals(signum).name)
                        forced_by.append(signum)
                        nursery.cancel_scope.cancel()
                        return
                    logger.info("%s: draining (up to %.0f s)", signal.Signals(signum).name, cfg.server.drain_timeout_s)
                    first_signal.set()

            nursery.start_soon(watch_signals)
            await serve(cfg, shutdown_trigger=shutdown_trigger)
            nursery.cancel_scope.cancel()
    return forced_by[0] if forced_by else None
