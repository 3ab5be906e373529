"""Models at real models' shapes with random bfloat16 weights: the GPU check's Qwen3-0.6B- and
Qwen3-8B-shaped models (bench/gpu_check, ``make bench-gpu``).

They are built like the text demos (worker/demo/model.py: the demo tokenizer, padded with
reserved tokens to Qwen3's vocabulary; the ChatML template; a Qwen3 ``config.json``) at the
real models' vocabulary, widths, depths and heads, the 8B with its own output head (untied
embeddings). Their weights are drawn by MLX on its default device, not by numpy as the demos'
are: on a GPU the 8B's 16 GB take seconds to draw, and a forward pass costs the same whatever
the values. A build's marker records its shape; a build of the same shape is reused.

They are not in the demo table (``demo:<name>``): that table is the configuration's list of
demos, and the 8B's 16 GB are no model to build by accident on a CPU. For a dry run on the
CPU, :func:`check_shapes` gives stand-ins at ``demo:tiny``'s dimensions.
"""

from __future__ import annotations

import json
import pathlib
from functools import partial
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from .model import qwen3_parameter_shapes, write_qwen3_model
from .recipe import (
    DEMO_FORMAT_VERSION,
    DEMO_MARKER,
    DEMO_SIZES,
    EMBED,
    EMBED_STD,
    LOGIT_STD,
    SPECIAL_ROW_SCALE,
    DemoSize,
    build_into,
    default_demo_cache_dir,
)

DTYPE = "bfloat16"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm.weight"
QWEN3_VOCAB = 151_936
QWEN3_CONTEXT = 40_960


@attrs.frozen
class ModelShape:
    """One model of the check: its name (the build directory's) and its dimensions."""

    name: str
    size: DemoSize
    #: False: an ``lm_head`` of its own beside the input embedding (Qwen3-8B), True: shared (0.6B).
    tie_word_embeddings: bool

    @property
    def num_parameters(self) -> int:
        head = 0 if self.tie_word_embeddings else self.size.vocab_size * self.size.hidden_size
        return self.size.num_parameters + head


QWEN3_0_6B = ModelShape(
    name="qwen3-0.6b-shape",
    size=DemoSize(
        vocab_size=QWEN3_VOCAB,
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        max_position_embeddings=QWEN3_CONTEXT,
    ),
    tie_word_embeddings=True,
)
QWEN3_8B = ModelShape(
    name="qwen3-8b-shape",
    size=DemoSize(
        vocab_size=QWEN3_VOCAB,
        hidden_size=4096,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=12288,
        max_position_embeddings=QWEN3_CONTEXT,
    ),
    tie_word_embeddings=False,
)
SHAPES = (QWEN3_0_6B, QWEN3_8B)


def dry_run_shape(shape: ModelShape) -> ModelShape:
    """``shape``'s stand-in at ``demo:tiny``'s dimensions, tied or untied as ``shape`` is."""
    return attrs.evolve(shape, name=f"{shape.name}-dry-run", size=DEMO_SIZES["tiny"])


def check_shapes(*, dry_run: bool) -> tuple[ModelShape, ...]:
    """The check's models: the real shapes, or their tiny stand-ins for a dry run."""
    return tuple(dry_run_shape(s) for s in SHAPES) if dry_run else SHAPES


def default_models_dir() -> pathlib.Path:
    """``bench-gpu`` beside the demo cache (``~/.cache/vllm-mlx-trio/bench-gpu`` by default)."""
    return default_demo_cache_dir().parent / "bench-gpu"


def build_shaped_model(directory: pathlib.Path, shape: ModelShape, *, seed: int = 0) -> pathlib.Path:
    """``shape``'s model in ``directory``: the build already there if it has this shape, else a new one."""
    if is_built(directory, shape):
        return directory
    write = partial(_write_model, shape=shape)
    return build_into(directory, write, seed=seed, dtype=DTYPE, replace=True)


def _write_model(directory: pathlib.Path, *, shape: ModelShape, seed: int, dtype: str) -> None:
    write_qwen3_model(
        directory,
        size=shape.name,
        shape=shape.size,
        seed=seed,
        dtype=dtype,
        save_weights=save_drawn_weights,
        tie_word_embeddings=shape.tie_word_embeddings,
    )


def is_built(directory: pathlib.Path, shape: ModelShape) -> bool:
    """Whether ``directory`` holds a complete build of ``shape`` in this format."""
    try:
        marker = json.loads((directory / DEMO_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    expected = {"format_version": DEMO_FORMAT_VERSION, "size": shape.name, "shape": attrs.asdict(shape.size)}
    return isinstance(marker, dict) and all(marker.get(k) == v for k, v in expected.items())


def save_drawn_weights(path: pathlib.Path, config: dict[str, Any], seed: int, damped_ids: list[int]) -> None:
    """Draw every parameter of ``config``'s model with MLX (the demos' scales) and save them."""
    shapes = qwen3_parameter_shapes(config)  # advances MLX's random key: seed after it
    mx.random.seed(seed)
    row_scale = _row_scale(config["vocab_size"], damped_ids)
    weights = {name: _drawn(name, shape, config["hidden_size"], row_scale) for name, shape in sorted(shapes.items())}
    mx.save_safetensors(str(path), weights, metadata={"format": "pt"})


def _row_scale(vocab_size: int, damped_ids: list[int]) -> mx.array:
    """A column of 1s with :data:`SPECIAL_ROW_SCALE` at ``damped_ids``: their logits stay near 0,
    so greedy decoding writes the corpus's tokens rather than the reserved ones."""
    scale = np.ones((vocab_size, 1), dtype=np.float32)
    scale[damped_ids] = SPECIAL_ROW_SCALE
    return mx.array(scale)


def _drawn(name: str, shape: tuple[int, ...], hidden_size: int, row_scale: mx.array) -> mx.array:
    """One parameter, evaluated: norms constant (the final one scales the logits to
    :data:`LOGIT_STD`), the embedding and output head at :data:`EMBED_STD` with damped rows,
    other matrices at 1/sqrt(fan_in)."""
    if name.endswith("norm.weight"):
        value = LOGIT_STD / (EMBED_STD * hidden_size**0.5) if name == FINAL_NORM else 1.0
        array = mx.full(shape, value)
    elif name in (EMBED, LM_HEAD):
        array = mx.random.normal(shape, scale=EMBED_STD) * row_scale
    else:
        array = mx.random.normal(shape, scale=shape[-1] ** -0.5)
    stored = array.astype(mx.bfloat16)  # drawn in float32: every backend has its kernels
    mx.eval(stored)
    return stored
