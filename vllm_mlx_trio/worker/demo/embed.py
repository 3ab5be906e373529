"""``demo:embed-tiny``: a random-weight embedding model in the sentence-transformers layout.

The tiny Qwen3 demo (same shape, tokenizer and weights recipe), float32, plus what an
embedding model's folder carries: ``modules.json`` naming a Pooling module whose
``1_Pooling/config.json`` pools the last token (Qwen3-Embedding's layout), a Normalize module,
and ``is_matryoshka`` in ``config.json`` so requests may ask for fewer ``dimensions``.
Served with ``engine.mode = "embed"``.
"""

from __future__ import annotations

import json
import pathlib

from .files import write_json
from .model import write_qwen3_demo
from .recipe import DEMO_SIZES

EMBED_TINY = "embed-tiny"

MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]
POOLING = {
    "word_embedding_dimension": DEMO_SIZES["tiny"].hidden_size,
    "pooling_mode_cls_token": False,
    "pooling_mode_mean_tokens": False,
    "pooling_mode_max_tokens": False,
    "pooling_mode_mean_sqrt_len_tokens": False,
    "pooling_mode_weightedmean_tokens": False,
    "pooling_mode_lasttoken": True,
    "include_prompt": True,
}


def write_embed_tiny(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """The tiny Qwen3 demo's files, then the embedding model's (the marker stays last: the
    folder is installed by rename only once complete)."""
    write_qwen3_demo(directory, size=EMBED_TINY, shape=DEMO_SIZES["tiny"], seed=seed, dtype=dtype)
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    write_json(config_file, {**config, "is_matryoshka": True})
    write_json(directory / "modules.json", MODULES)
    (directory / "1_Pooling").mkdir()
    write_json(directory / "1_Pooling" / "config.json", POOLING)
    (directory / "2_Normalize").mkdir()
