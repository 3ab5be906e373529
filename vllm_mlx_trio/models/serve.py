"""``serve_models(cfg)``: a server of the ``[[models]]`` of ``cfg``, loaded on demand."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import hypercorn.trio
import trio

from ..config import EngineConfig, ModelEntry
from ..core.memory import available_memory_bytes
from ..engine import Engine
from ..http.app import create_app
from ..http.auth import load_api_keys
from ..http.model_router import create_router_app
from ..http.models_routes import create_models_app
from ..logs import logfmt_value
from .footprint import MIB, loaded_footprint
from .registry import EngineOpener, ModelRegistry
from .steps import engine_opener

logger = logging.getLogger(__name__)


def budget_bytes(cfg: EngineConfig) -> int:
    """``server.model_memory_mb``, else ``model_memory_percent`` of the memory available now."""
    if cfg.server.model_memory_mb is not None:
        return cfg.server.model_memory_mb * MIB
    return int(cfg.server.model_memory_percent * available_memory_bytes())


async def serve_models(
    cfg: EngineConfig,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    opener: EngineOpener | None = None,
    measure: Callable[[Engine], int] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the pinned models, then serve HTTP until ``shutdown_trigger`` returns; the other
    models load when first asked for. On the trigger, Hypercorn gives in-flight responses
    ``server.drain_timeout_s``, then every model is unloaded.

    ``opener``: how a model's engine is opened (default: as ``server.model_steps`` says);
    ``measure``: a loaded model's footprint in bytes (default: models/footprint.py's).
    """
    from ..serve import hypercorn_config  # serve.py dispatches here: imported late

    api_keys = load_api_keys(cfg.server)

    def serving(engine: Engine, entry: ModelEntry):
        return create_app(engine, entry.config, api_keys=api_keys)

    registry = ModelRegistry(
        cfg,
        budget=budget_bytes(cfg),
        opener=opener or engine_opener(cfg),
        serving=serving,
        measure=measure or loaded_footprint,
    )
    app = create_router_app(registry, create_models_app(registry, cfg, api_keys), cfg, api_keys)
    async with trio.open_nursery() as nursery:
        await nursery.start(registry.run)
        hc = hypercorn_config(cfg)

        async def serve_http(task_status: trio.TaskStatus[list[str]]) -> None:
            try:
                await hypercorn.trio.serve(app, hc, shutdown_trigger=shutdown_trigger, task_status=task_status)
            finally:
                with trio.CancelScope(shield=True):
                    await registry.unload_all(cfg.server.drain_timeout_s)

        binds = await nursery.start(serve_http)
        logger.info("%s", _summary(registry, binds))
        task_status.started(binds)


def _summary(registry: ModelRegistry, binds: list[str]) -> str:
    names = ",".join(slot.name for slot in registry.slots)
    pinned = ",".join(slot.name for slot in registry.slots if slot.entry.pinned) or "none"
    return (
        f"ready: models={logfmt_value(names)} pinned={logfmt_value(pinned)} "
        f"model_memory_mb={registry.budget // MIB} model_steps={registry.cfg.server.model_steps} "
        f"listening={','.join(binds)}"
    )
