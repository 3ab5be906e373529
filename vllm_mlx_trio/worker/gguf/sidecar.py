"""The folder a GGUF file is served from beside its weights: ``config.json``, ``tokenizer.json``
and ``tokenizer_config.json`` rebuilt from its metadata, written once into
``<cache>/gguf/<name>-<key>`` (no weights; the key hashes the file's path, size and mtime).

No MLX here: the benchmarks' clients read the tokenizer from this folder too.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import attrs

from ..demo import default_demo_cache_dir
from .arch import hf_config
from .file import GGUFError, GGUFHeader, gguf_file, is_gguf_path, read_header
from .tokenizer import tokenizer_files

#: Bump when what the folder holds changes, so older folders are rewritten.
SIDECAR_VERSION = 1


@attrs.frozen
class GGUFModel:
    """A checked GGUF file and the folder with its config and tokenizer."""

    header: GGUFHeader
    config: dict[str, Any]
    folder: pathlib.Path


def default_gguf_cache_dir() -> pathlib.Path:
    """Beside the demo builds: ``<cache>/gguf``."""
    return default_demo_cache_dir().parent / "gguf"


def open_gguf_model(path: str, cache_dir: pathlib.Path | None = None) -> GGUFModel:
    """Check the GGUF file ``path`` names and make its folder; :class:`GGUFError` naming the file
    for a file, architecture or tokenizer that cannot be served."""
    file = gguf_file(path)
    header = read_header(file)
    try:
        config = hf_config(header.metadata, set(header.tensor_types))
        folder = _folder(header, config, cache_dir or default_gguf_cache_dir())
    except KeyError as exc:
        raise GGUFError(f"{file}: {exc.args[0]}") from None
    return GGUFModel(header=header, config=config, folder=folder)


def tokenizer_dir(model_dir: str) -> str:
    """Where a Hugging Face ``AutoTokenizer`` finds the tokenizer of ``model_dir``: its GGUF
    file's folder (made if needed), else ``model_dir`` itself."""
    return str(open_gguf_model(model_dir).folder) if is_gguf_path(model_dir) else model_dir


def _folder(header: GGUFHeader, config: dict[str, Any], root: pathlib.Path) -> pathlib.Path:
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
