"""The front app of a server with ``[[models]]``: the model list with each model's state, load
and unload on request, the status of every model, and ``/health``.

It has the single-model app's request ids, CORS, API keys and error shapes (http/app.py); the
model routes themselves reach each model's own app through http/model_router.py.
"""

from __future__ import annotations

import trio
from quart_trio import QuartTrio

from ..config import EngineConfig
from ..models.footprint import MIB
from ..models.registry import ModelRegistry, ModelSlot, ModelState
from .app import register_error_handlers, register_request_ids_and_access
from .auth import ApiKeys
from .openai.routes import input_modalities
from .ops_routes import ThroughputMeter, status_body, version_body


def create_models_app(registry: ModelRegistry, cfg: EngineConfig, api_keys: ApiKeys) -> QuartTrio:
    app = QuartTrio("vllm_mlx_trio.models")
    app.config["JSON_SORT_KEYS"] = False
    app.json.sort_keys = False
    started_at = trio.current_time()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card for slot in registry.slots for card in model_cards(slot)]}

    @app.post("/v1/models/<path:name>/load")
    async def load(name: str):
        slot = registry.slot_for_name(name)
        lease = await registry.acquire(slot)
        lease.release()
        return model_cards(slot)[0]

    @app.delete("/v1/models/<path:name>")
    async def unload(name: str):
        slot = registry.slot_for_name(name)
        await registry.unload(slot)
        return {**model_cards(slot)[0], "unloaded": True}

    @app.get("/v1/status")
    async def status():
        return {
            "uptime_s": round(trio.current_time() - started_at, 3),
            "memory": {"budget_mb": registry.budget // MIB, "loaded_mb": registry.loaded_bytes() // MIB},
            "models": [_slot_status(slot) for slot in registry.slots],
        }

    versions = version_body()

    @app.get("/version")
    async def version():
        return versions

    register_request_ids_and_access(app, cfg, api_keys)
    register_error_handlers(app)
    return app


def model_cards(slot: ModelSlot) -> list[dict]:
    """``/v1/models``' cards of one model: one per served name, then one per named adapter (its
    ``parent`` the model), each with the model's state."""
    engine = slot.engine
    cfg = slot.entry.config
    if engine is not None:
        max_model_len = engine.model_info.max_context_tokens
        modalities = input_modalities(engine.model_info.media_kinds)
    else:
        max_model_len, modalities = cfg.model.max_model_len, None
    card = {
        "object": "model",
        "created": 0,
        "owned_by": "vllm-mlx-trio",
        "max_model_len": max_model_len,
        "input_modalities": modalities,
        "state": slot.state.value,
        "pinned": slot.entry.pinned,
        "root": slot.name,
    }
    if slot.error is not None and slot.state is ModelState.FAILED:
        card["error"] = str(slot.error)
    paths = dict(cfg.model.adapters)
    adapters = [
        {"id": served, **card, "root": paths[adapter], "parent": cfg.model_name}
        for served, adapter in cfg.adapter_names.items()
    ]
    return [{"id": name, **card} for name in cfg.served_names] + adapters


def _slot_status(slot: ModelSlot) -> dict:
    now = trio.current_time()
    body: dict = {
        "name": slot.name,
        "path": slot.entry.config.model.path,
        "state": slot.state.value,
        "pinned": slot.entry.pinned,
        "memory_mb": None if slot.footprint is None else slot.footprint // MIB,
        "requests": slot.leases,
        "waiting_for_load": slot.waiting,
        "loading_for_s": None if slot.loading_since is None else round(now - slot.loading_since, 3),
        "load_phase": slot.load_phase,
        "idle_s": None if slot.leases or slot.last_used == float("-inf") else round(now - slot.last_used, 3),
        "error": None if slot.error is None else str(slot.error),
    }
    if slot.engine is not None and slot.state is ModelState.LOADED:
        body["engine"] = status_body(slot.engine, ThroughputMeter.for_engine(slot.engine))
    return body
