"""The agreeing demo pair for speculative decoding: ``demo:spec-target`` and ``demo:spec-draft``.

Both are built by worker/demo/model.py's Qwen3 writer (same tokenizer, same seed, same random draw) with one change to
the weights. The target has :data:`TARGET_LAYERS` layers of which every one after the first has its attention output
projection and its MLP down projection zeroed: those layers still cost their full compute, but add exactly zero to
the residual stream. The draft is the target's embedding, first layer and final norm (the head is tied), so it
computes the same logits as the target with a fraction of the work and agrees with it on (almost) every token;
only rounding differences between a one-token and a several-token forward can split a near tie.

That makes acceptance and the speedup of ``method = "draft"`` measurable without downloads
(``vllm-mlx-trio bench speculative``, docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .model import random_weights
from .recipe import DemoSize

#: Layers of the target: the first does the work, the rest cost compute and change nothing.
TARGET_LAYERS = 16
#: The shape both share (the tokenizer is ``small``'s: 4096 tokens).
_SHAPE = dict(
    vocab_size=4096,
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    intermediate_size=768,
    max_position_embeddings=4096,
)

SPEC_SIZES: dict[str, DemoSize] = {
    "spec-target": DemoSize(num_hidden_layers=TARGET_LAYERS, **_SHAPE),
    "spec-draft": DemoSize(num_hidden_layers=1, **_SHAPE),
}

#: The parameters of a layer that write into the residual stream: zeroed, the layer adds nothing.
_RESIDUAL_WRITERS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def spec_weights(size: str, config: dict[str, Any], seed: int, damped_ids: list[int]) -> dict[str, np.ndarray]:
    """The weights of ``demo:<size>`` (``spec-target`` or ``spec-draft``) for its ``config.json``."""
    target = random_weights({**config, "num_hidden_layers": TARGET_LAYERS}, seed, damped_ids)
    for layer in range(1, TARGET_LAYERS):
        for name in _RESIDUAL_WRITERS:
            target[f"model.layers.{layer}.{name}"][...] = 0.0
    if size == "spec-target":
        return target
    return {
        name: array
        for name, array in target.items()
        if not name.startswith("model.layers.") or name.startswith("model.layers.0.")
    }
