"""How many tokens of KV the running sequences may hold: measured on the MLX thread.

The model's KV bytes per token are measured, not computed from config.json: a short probe
prompt runs through a fresh prompt cache and each layer's key and value arrays are weighed
per token slot. That covers grouped-query attention, odd head sizes and quantized caches.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache

from ..config import EngineSection
from ..core.memory import available_memory_bytes

logger = logging.getLogger(__name__)

#: Tokens in the probe prompt; any positive number allocates every layer's cache.
PROBE_TOKENS = 4
MIB = 1024 * 1024


def kv_bytes_per_token(model: Any) -> int:
    """KV bytes one token takes across all layers of ``model``."""
    cache = make_prompt_cache(model)
    model(mx.zeros((1, PROBE_TOKENS), dtype=mx.int32), cache=cache)
    return max(1, math.ceil(sum(_layer_bytes_per_token(layer) for layer in cache)))


def _layer_bytes_per_token(layer: Any) -> float:
    """Bytes per token slot of one layer's keys and values (arrays shaped [B, H, T, D]).

    Caches are allocated in steps of many tokens, so the slot size is measured, not the
    fill. A layer without keys (a recurrent state) holds a fixed size: nothing per token.
    """
    if not hasattr(layer, "keys"):
        return sum(_layer_bytes_per_token(c) for c in getattr(layer, "caches", ()))
    arrays = [a for _, a in tree_flatten([layer.keys, layer.values]) if isinstance(a, mx.array)]
    mx.eval(arrays)
    return sum(a.size * a.itemsize / a.shape[-2] for a in arrays if a.ndim == 4)


def kv_budget_bytes(engine: EngineSection) -> int:
    """``engine.kv_memory_mb``, else ``kv_memory_percent`` of the memory available now."""
    if engine.kv_memory_mb is not None:
        return engine.kv_memory_mb * MIB
    return int(engine.kv_memory_percent * _available_after_load())


def _available_after_load() -> int:
    """Memory still free for KV: the system's, capped by Metal's working set where there is one."""
    available = available_memory_bytes()
    if mx.metal.is_available():
        working_set = mx.device_info().get("max_recommended_working_set_size")
        if isinstance(working_set, int) and working_set > 0:
            available = min(available, working_set - mx.get_active_memory())
    return max(available, 0)


def kv_budget_tokens(model: Any, engine: EngineSection) -> tuple[int, int]:
    """(tokens of KV the budget holds, KV bytes per token), logged once at load."""
    per_token = kv_bytes_per_token(model)
    budget = kv_budget_bytes(engine)
    tokens = budget // per_token
    logger.info(
        "KV budget for running sequences: %d tokens (%.1f MiB at %d bytes per token)",
        tokens,
        budget / MIB,
        per_token,
    )
    return tokens, per_token
