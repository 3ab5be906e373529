"""Serving a GGUF file directly: its header checked, its tokenizer and config written once into
a small cache folder (``<cache>/gguf/<name>-<key>``: no weights), its tensors read by ``mx.load``
straight into mlx-lm's model for the architecture."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import shutil
import tempfile
from typing import Any

from mlx_lm.utils import load_tokenizer

from ..demo import default_demo_cache_dir
from .arch import hf_config
from .file import GGUFError, GGUFHeader, gguf_file, read_header
from .tokenizer import tokenizer_files
from .weights import FLOAT_DTYPES, build_model, dequantized, read_tensors, weight_bytes

logger = logging.getLogger(__name__)

#: Bump when what the cache folder holds changes, so older folders are rewritten.
SIDECAR_VERSION = 1
#: ``[model] gguf_dtype``: keep the file's packed layout, or dequantize into one float dtype.
NATIVE = "native"


def default_gguf_cache_dir() -> pathlib.Path:
    """Beside the demo builds: ``<cache>/gguf``."""
    return default_demo_cache_dir().parent / "gguf"


def load_gguf(path: str, *, dtype: str = NATIVE, cache_dir: pathlib.Path | None = None) -> tuple[Any, Any, dict]:
    """(model, tokenizer, config) of the GGUF file ``path`` names; :class:`GGUFError` (a
    ``ModelLoadError``) naming the file for anything that cannot be served."""
    file = gguf_file(path)
    header = read_header(file)
    try:
        config = hf_config(header.metadata, set(header.tensor_types))
        folder = _sidecar(header, config, cache_dir or default_gguf_cache_dir())
        weights = read_tensors(file)
    except KeyError as exc:
        raise GGUFError(f"{file}: {exc.args[0]}") from None
    if dtype != NATIVE:
        weights = dequantized(weights, FLOAT_DTYPES[dtype])
    model = build_model(config, weights)
    _log_loaded(header, dtype, weight_bytes(model))
    tokenizer = load_tokenizer(folder, eos_token_ids=config["eos_token_id"])
    return model, tokenizer, config


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


def _sidecar(header: GGUFHeader, config: dict[str, Any], root: pathlib.Path) -> pathlib.Path:
    """The cache folder with config.json and the tokenizer files for ``header``'s file, written
    on first use (into a temporary sibling, renamed into place)."""
    stat = header.path.stat()
    identity = f"{header.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{SIDECAR_VERSION}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    folder = root / f"{header.path.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer_json, tokenizer_config = tokenizer_files(header.metadata, max_length=config["max_position_embeddings"])
    root.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    try:
        for name, content in (("tokenizer.json", tokenizer_json), ("tokenizer_config.json", tokenizer_config)):
            (tmp / name).write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")  # last: marks it complete
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():  # not a concurrent writer's finished folder
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
