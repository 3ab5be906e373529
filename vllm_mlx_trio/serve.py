"""``serve(cfg)``: the engine plus Hypercorn in one nursery, embeddable in any Trio program."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable

import hypercorn
import hypercorn.trio
import trio

from .config import EngineConfig
from .engine import Engine, ExecutorFactory, open_engine
from .http.app import create_app

logger = logging.getLogger(__name__)


def hypercorn_config(cfg: EngineConfig) -> hypercorn.Config:
    hc = hypercorn.Config()
    hc.bind = [f"{cfg.server.host}:{cfg.server.port}"]
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

    ``started`` reports the bound URLs. After the trigger, Hypercorn stops accepting and gives
    in-flight responses ``server.drain_timeout_s`` to finish; then the engine stops.
    """
    async with open_engine(cfg, executor_factory=executor_factory) as engine:
        await serve_engine(engine, shutdown_trigger=shutdown_trigger, task_status=task_status)


async def serve_engine(
    engine: Engine,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve an already open engine over HTTP (the engine's lifetime stays the caller's)."""
    cfg = engine.cfg
    app = create_app(engine, cfg)
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: hypercorn.trio.serve(
                app, hypercorn_config(cfg), shutdown_trigger=shutdown_trigger, task_status=task_status
            )
        )
        logger.info("serving %s (%s mode) on %s", cfg.model_name, cfg.engine.mode, ", ".join(binds))
        task_status.started(binds)


async def serve_until_signalled(cfg: EngineConfig) -> None:
    """``serve`` with SIGINT/SIGTERM as the shutdown trigger; a second signal stops at once."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        first_signal = trio.Event()

        async def shutdown_trigger() -> None:
            await first_signal.wait()

        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    if first_signal.is_set():
                        logger.warning("second %s: stopping now", signal.Signals(signum).name)
                        nursery.cancel_scope.cancel()
                        return
                    logger.info(
                        "%s: draining (up to %.0f s)", signal.Signals(signum).name, cfg.server.drain_timeout_s
                    )
                    first_signal.set()

            nursery.start_soon(watch_signals)
            await serve(cfg, shutdown_trigger=shutdown_trigger)
            nursery.cancel_scope.cancel()
