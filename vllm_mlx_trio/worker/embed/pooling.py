"""How an embedding model pools its hidden states, read as sentence-transformers writes it.

A sentence-transformers model folder lists its modules in ``modules.json``; the Pooling
module's folder (``1_Pooling/``) holds a ``config.json`` with one ``pooling_mode_*`` flag set:
``lasttoken`` (Qwen3-Embedding), ``mean_tokens`` or ``cls_token``. ``[model] pooling = "auto"``
reads it; a model without one pools its last token (the causal embedding models' choice).
"""

from __future__ import annotations

import json
import logging
import pathlib

from ...errors import ModelLoadError

logger = logging.getLogger(__name__)

POOLING_MODULE = "sentence_transformers.models.Pooling"
#: sentence-transformers' flags, by the pooling each selects.
_MODES = {"pooling_mode_lasttoken": "last", "pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
#: What "auto" picks when the model says nothing.
DEFAULT_POOLING = "last"


def resolve_pooling(configured: str, model_dir: pathlib.Path | None) -> str:
    """``configured`` unless it is "auto"; then the model folder's Pooling module's mode."""
    if configured != "auto":
        return configured
    pooling_config = _pooling_config(model_dir) if model_dir is not None else None
    if pooling_config is None:
        return DEFAULT_POOLING
    modes = [pooling for flag, pooling in _MODES.items() if pooling_config.get(flag)]
    if len(modes) != 1:
        raise ModelLoadError(
            f"the model's pooling config sets {modes or 'no supported mode'}; set [model] pooling to last, mean or cls"
        )
    return modes[0]


def _pooling_config(model_dir: pathlib.Path) -> dict | None:
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return None
    modules = json.loads(modules_file.read_text())
    for module in modules:
        if module.get("type") == POOLING_MODULE:
            config_file = model_dir / module.get("path", "") / "config.json"
            return json.loads(config_file.read_text()) if config_file.is_file() else None
    return None


def local_model_dir(path: str, revision: str | None = None) -> pathlib.Path | None:
    """The folder a model path names: itself when local, else its hub snapshot in the local
    cache (mlx_lm.load has just downloaded it), else None."""
    local = pathlib.Path(path)
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        return pathlib.Path(snapshot_download(path, revision=revision, local_files_only=True))
    except Exception as exc:  # boundary: not a hub id, or not in the cache
        logger.info("no local folder for %r (%s); pooling config not read", path, exc)
        return None
