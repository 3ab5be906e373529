"""What a model takes besides text, read from its ``config.json`` before it loads.

A vision-language (or audio) checkpoint declares its tower in ``config.json`` (``vision_config``,
``audio_config``), as vllm-mlx routes models: ``engine.mode = "auto"`` serves such a model
through the vlm runner and every other model through the batched runner
(worker/auto_runner.py). The same reading lets a text runner say why it serves a
vision-language model text-only, and the vlm runner refuse a text model at startup.

Reading a hub model's ``config.json`` downloads that one file (as loading would anyway).
Imports no MLX.
"""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Mapping
from typing import Any

from ..errors import ModelLoadError

logger = logging.getLogger(__name__)

#: config.json keys that declare a tower, and what each one makes the model take.
TOWER_KEYS = (("vision_config", "vision"), ("audio_config", "audio"))


def declared_towers(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The towers ("vision", "audio") ``config`` declares beside its language model."""
    return tuple(tower for key, tower in TOWER_KEYS if isinstance(config.get(key), Mapping) and config[key])


def read_model_config(path: str, *, revision: str | None = None) -> dict[str, Any]:
    """``config.json`` of the model at ``path`` (a local directory, or a hub id); ``{}`` for a
    GGUF file (a text model: it has no config.json). Raises :class:`ModelLoadError`."""
    from .gguf import is_gguf_path

    if is_gguf_path(path):
        return {}
    local = pathlib.Path(path)
    try:
        if local.is_dir():
            file = local / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            file = pathlib.Path(hf_hub_download(path, "config.json", revision=revision))
        return json.loads(file.read_text(encoding="utf-8"))
    except Exception as exc:  # boundary: filesystem, hub and JSON errors
        raise ModelLoadError(f"could not load model {path!r}: {type(exc).__name__}: {exc}") from exc


def text_only_note(config: Mapping[str, Any]) -> str | None:
    """For a model with a tower served by a text runner: the sentence that says so (logged at
    startup, and added to a media part's 400). None for a text model."""
    towers = declared_towers(config)
    if not towers:
        return None
    return (
        f"This {config.get('model_type', 'multimodal')} model declares a {' and '.join(towers)} tower but is "
        'served text-only: the configured runner runs text models (engine.mode "batched", "simple", '
        '"speculative" or "distributed"); engine.mode = "auto" (or "vlm") serves its media, with speculative '
        "decoding too."
    )
