"""Model loading on the MLX thread: demo models are built first; a GGUF file is served directly
(worker/gguf/); everything else goes through ``mlx_lm.load`` exactly as a downloaded model does
(hub id or local directory)."""

from __future__ import annotations

import contextlib
import json
import logging
import pathlib
from collections.abc import Iterator
from typing import Any

import mlx.core as mx
import mlx_lm

from ..config import EngineSection, ModelConfig
from ..core.text import byte_level_table
from ..errors import ModelLoadError
from ..messages import ModelInfo
from .demo import is_demo_path, resolve_demo_model
from .demo.adapter import resolve_demo_adapter
from .gguf import is_gguf_path
from .gguf.dtype import gguf_dtype
from .gguf.loader import load_gguf
from .kv_budget import kv_budget_tokens
from .modality import text_only_note

logger = logging.getLogger(__name__)

#: Context length assumed when a model's config.json names none.
FALLBACK_CONTEXT_TOKENS = 4096
_CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length")


def resolve_model_path(model_cfg: ModelConfig) -> str:
    """A local directory for ``demo:<size>`` (built once, cached), else the path unchanged."""
    if is_demo_path(model_cfg.path):
        return str(resolve_demo_model(model_cfg.path, model_cfg.demo_cache_dir))
    return model_cfg.path


def resolve_or_fail(model_cfg: ModelConfig) -> str:
    """:func:`resolve_model_path`, its failures (a demo that cannot be built) a one-line ModelLoadError."""
    try:
        return resolve_model_path(model_cfg)
    except Exception as exc:  # boundary: demo builds (downloads, filesystem)
        raise ModelLoadError(f"could not load model {model_cfg.path!r}: {type(exc).__name__}: {exc}") from exc


#: Set while a distributed runner loads its inner runner: (group, pipeline?) to shard over.
_SHARDING: tuple[Any, bool] | None = None


@contextlib.contextmanager
def sharded_over(group: Any, *, pipeline: bool = False) -> Iterator[None]:
    """Models loaded inside are sharded over ``group`` (tensor-parallel, or pipelined), as
    ``mlx_lm.utils.sharded_load`` does; the inner runner loads as it always does."""
    global _SHARDING
    _SHARDING = (group, pipeline)
    try:
        yield
    finally:
        _SHARDING = None


def sharding() -> bool:
    """Whether models load sharded now: every rank must then make the same choices."""
    return _SHARDING is not None


def is_vision_checkpoint(model_cfg: ModelConfig) -> bool:
    """Whether the model is a local checkpoint of a vision-language model (its config.json has
    a ``vision_config``); a hub id is checked once loaded (:func:`load_model`)."""
    path = pathlib.Path(resolve_model_path(model_cfg)) / "config.json"
    try:
        return _has_vision(json.loads(path.read_text()))
    except (OSError, ValueError):  # not a local checkpoint: the loader says what it is
        return False


def _has_vision(config: dict) -> bool:
    return isinstance(config, dict) and "vision_config" in config


def _shard(model: Any, model_cfg: ModelConfig) -> None:
    group, pipeline = _SHARDING  # type: ignore[misc]
    inner = getattr(model, "model", None)
    if pipeline and not hasattr(inner, "pipeline"):
        raise ModelLoadError(f"model {model_cfg.path!r}: its architecture does not support pipeline sharding")
    if not pipeline and not hasattr(model, "shard"):
        raise ModelLoadError(f"model {model_cfg.path!r}: its architecture does not support tensor parallelism")
    if pipeline:
        inner.pipeline(group)
        logger.info("rank %d: pipeline stage with layers %d-%d", group.rank(), inner.start_idx, inner.end_idx - 1)
    else:
        model.shard(group)
    mx.eval(model.parameters())


def load_model(model_cfg: ModelConfig) -> tuple[Any, Any, dict]:
    """Load (model, tokenizer, config dict); any failure becomes a one-line ModelLoadError."""
    try:
        path = resolve_model_path(model_cfg)
        if is_gguf_path(path):
            refuse_adapter(model_cfg, "a GGUF file")
            model, tokenizer, config = load_gguf(
                path, dtype=gguf_dtype(model_cfg.gguf_dtype), cache_dir=_gguf_cache_dir(model_cfg)
            )
        else:
            tokenizer_config = {"trust_remote_code": True} if model_cfg.trust_remote_code else None
            model, tokenizer, config = mlx_lm.load(
                path,
                tokenizer_config=tokenizer_config,
                adapter_path=resolve_adapter_path(model_cfg),
                revision=model_cfg.revision,
                trust_remote_code=model_cfg.trust_remote_code,
                return_config=True,
            )
    except ModelLoadError:
        raise
    except Exception as exc:  # boundary: hub, filesystem, safetensors and mlx-lm errors
        raise ModelLoadError(f"could not load model {model_cfg.path!r}: {type(exc).__name__}: {exc}") from exc
    if _SHARDING is not None:
        refuse_adapter(model_cfg, "a sharded model")
        if _has_vision(config):
            raise ModelLoadError(
                f"model {model_cfg.path!r} is a vision-language model: sharded serving "
                '(engine.mode = "distributed") takes text models only'
            )
        _shard(model, model_cfg)
    if model_cfg.chat_template is not None:
        # The last change to the tokenizer on this thread: it is handed to the Trio side in
        # ModelInfo and never touched here again (docs/architecture.md, "Who owns the tokenizer").
        tokenizer._tokenizer.chat_template = model_cfg.chat_template
    return model, tokenizer, config


def resolve_adapter_path(model_cfg: ModelConfig) -> str | None:
    """The adapter folder ``model.adapter_path`` names (a demo adapter built first), or None."""
    path = model_cfg.adapter_path
    if path is None:
        return None
    if is_demo_path(path):
        return str(resolve_demo_adapter(path, model_cfg.demo_cache_dir))
    if not (pathlib.Path(path) / "adapter_config.json").is_file():
        raise ModelLoadError(f"model.adapter_path {path!r}: no adapter_config.json there (mlx-lm's adapter format)")
    return path


def refuse_adapter(model_cfg: ModelConfig, what: str) -> None:
    """``model.adapter_path`` cannot be applied to ``what``: a load error, never ignored."""
    if model_cfg.adapter_path is not None:
        raise ModelLoadError(f"model.adapter_path is not supported for {what} (model {model_cfg.path!r})")
    if model_cfg.adapters:
        raise ModelLoadError(f"model.adapters is not supported for {what} (model {model_cfg.path!r})")


def _gguf_cache_dir(model_cfg: ModelConfig) -> pathlib.Path | None:
    """Where a GGUF file's tokenizer and config are kept: beside the demo builds."""
    return pathlib.Path(model_cfg.demo_cache_dir) / "gguf" if model_cfg.demo_cache_dir else None


def context_length(config: dict) -> int:
    """The model's maximum context in tokens, from its config.json."""
    for key in _CONTEXT_KEYS:
        value = config.get(key) or config.get("text_config", {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    logger.warning("model config names no context length; assuming %d", FALLBACK_CONTEXT_TOKENS)
    return FALLBACK_CONTEXT_TOKENS


def load_for_serving(model_cfg: ModelConfig, engine: EngineSection) -> tuple[Any, ModelInfo]:
    """Load the model and describe it: (model, the :class:`ModelInfo` the executor reports)."""
    model, tokenizer, config = load_model(model_cfg)
    vocab_size = int(config.get("vocab_size") or len(tokenizer.get_vocab()))
    budget_tokens, bytes_per_token = kv_budget_tokens(model, engine)
    info = ModelInfo(
        model_path=resolve_model_path(model_cfg),
        max_context_tokens=context_length(config),
        vocab_size=vocab_size,
        eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),
        tokenizer=tokenizer,
        token_bytes=byte_level_table(tokenizer),
        kv_budget_tokens=budget_tokens,
        kv_bytes_per_token=bytes_per_token,
        text_only_note=_text_only(model_cfg, config),
    )
    return model, info


def _text_only(model_cfg: ModelConfig, config: dict) -> str | None:
    """A vision-language model loaded by a text runner is served text-only: said once at startup."""
    note = text_only_note(config)
    if note is not None:
        logger.warning("model %r: %s", model_cfg.path, note)
    return note


def mlx_memory(*, idle: bool = False) -> tuple[int, int, int]:
    """MLX's (active, peak, buffer cache) memory in bytes, for the metrics.

    ``idle`` (no sequence left in the model): first hand MLX's cache of freed buffers back
    to the system. MLX keeps them for reuse with no limit by default; batches of changing
    shapes leave tens of MiB behind that an idle server would otherwise hold for good.
    """
    if idle:
        mx.clear_cache()
    return mx.get_active_memory(), mx.get_peak_memory(), mx.get_cache_memory()
