"""What a loaded model holds in memory, for the models' budget: its weights (as stored on
disk: MLX maps safetensors as they are) plus its KV (the running sequences' budget and the
prefix cache's), and the estimate used before its first load."""

from __future__ import annotations

import logging
import pathlib

from ..config import EngineConfig
from ..engine import Engine

logger = logging.getLogger(__name__)

MIB = 1024 * 1024
#: The files that hold a checkpoint's weights.
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".npz")


def loaded_footprint(engine: Engine) -> int:
    """Bytes ``engine`` holds: weights on disk plus its KV budgets."""
    return weight_bytes(engine.model_info.model_path, engine.cfg.model.revision) + kv_bytes(engine)


def kv_bytes(engine: Engine) -> int:
    """The running sequences' KV budget plus the prefix cache's, in bytes."""
    info = engine.model_info
    running = (info.kv_budget_tokens or 0) * info.kv_bytes_per_token
    cache = engine.statistics().cache
    prefix = 0
    if cache.enabled:
        if cache.pool.max_bytes is not None:
            prefix = cache.pool.max_bytes
        elif cache.pool.max_blocks is not None:
            prefix = cache.pool.max_blocks * engine.cfg.cache.block_size * info.kv_bytes_per_token
    return running + prefix


def estimated_footprint(cfg: EngineConfig) -> int:
    """Before a first load: weights of a local checkpoint (0 when not on disk yet) plus the
    KV budgets the configuration fixes in MiB (0 for those given as a share of memory)."""
    kv = (cfg.engine.kv_memory_mb or 0) * MIB
    if cfg.cache.enabled and cfg.cache.memory_aware:
        kv += (cfg.cache.memory_mb or 0) * MIB
    local = pathlib.Path(cfg.model.path)
    return (weight_bytes(str(local), None) if local.exists() else 0) + kv


def weight_bytes(path: str, revision: str | None) -> int:
    """Bytes of the weight files of a local checkpoint (a folder, or one GGUF file) or of a hub
    repository already in the local hub cache; 0 when neither is found."""
    local = pathlib.Path(path)
    if local.is_file():
        return local.stat().st_size
    if not local.is_dir():
        local = _hub_snapshot(path, revision)
        if local is None:
            return 0
    return sum(f.stat().st_size for f in local.rglob("*") if f.is_file() and f.suffix in WEIGHT_SUFFIXES)


def _hub_snapshot(repo_id: str, revision: str | None) -> pathlib.Path | None:
    """The local snapshot of a hub repository (never a download), or None."""
    try:
        from huggingface_hub import snapshot_download

        return pathlib.Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except Exception as exc:  # boundary: not a repository id, or not in the cache
        logger.debug("no local snapshot of %r: %s", repo_id, exc)
        return None
