"""Serving a GGUF file directly: its header checked and its config and tokenizer rebuilt
(sidecar.py), its tensors read by ``mx.load`` straight into mlx-lm's model for the architecture."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

from mlx_lm.utils import load_tokenizer

from .file import GGUFHeader
from .sidecar import open_gguf_model
from .weights import FLOAT_DTYPES, build_model, dequantized, read_tensors, weight_bytes

logger = logging.getLogger(__name__)

#: ``[model] gguf_dtype``: keep the file's packed layout, or dequantize into one float dtype.
NATIVE = "native"


def load_gguf(path: str, *, dtype: str = NATIVE, cache_dir: pathlib.Path | None = None) -> tuple[Any, Any, dict]:
    """(model, tokenizer, config) of the GGUF file ``path`` names; :class:`GGUFError` (a
    ``ModelLoadError``) naming the file for anything that cannot be served."""
    gguf = open_gguf_model(path, cache_dir)
    weights = read_tensors(gguf.header, gguf.config)
    if dtype != NATIVE:
        weights = dequantized(weights, FLOAT_DTYPES[dtype])
    model = build_model(gguf.config, weights)
    _log_loaded(gguf.header, dtype, weight_bytes(model))
    tokenizer = load_tokenizer(gguf.folder, eos_token_ids=gguf.config["eos_token_id"])
    return model, tokenizer, gguf.config


def _log_loaded(header: GGUFHeader, dtype: str, nbytes: int) -> None:
    counts = ", ".join(f"{count} {kind}" for kind, count in sorted(header.type_counts().items()))
    if dtype == NATIVE:
        name, arch = header.path.name, header.architecture
        logger.info("%s: %s, tensors %s, %.0f MiB as stored", name, arch, counts, nbytes / 2**20)
    else:
        logger.warning(
            "%s: dequantized to %s (tensors %s): the weights take %.0f MiB, against %.0f MiB on disk",
            header.path.name,
            dtype,
            counts,
            nbytes / 2**20,
            header.path.stat().st_size / 2**20,
        )
