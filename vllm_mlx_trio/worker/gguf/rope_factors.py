"""Llama 3's RoPE scaling as a GGUF file holds it: ``rope_freqs.weight``, one factor per pair of
head dimensions.

llama.cpp's converter writes a llama3-scaled model's RoPE as that tensor (1 for short
wavelengths, the scaling factor for long ones, a smooth blend between) instead of config keys,
and llama.cpp divides each pair's rotation angle by its factor. mlx-lm's ``Llama3RoPE`` rotates
by ``position / freqs`` with ``freqs = base ** (2i / dims)`` adjusted by the same rule, so the
file's factors give the frequencies exactly: ``base ** (2i / dims) * factor``.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .arch import ROPE_FACTORS


class FactoredRoPE(nn.Module):
    """RoPE at the given per-pair frequencies (``mx.fast.rope``'s ``freqs``, as mlx-lm's
    ``Llama3RoPE`` calls it); not a parameter, so the weights load strictly without it."""

    def __init__(self, dims: int, traditional: bool, freqs: mx.array) -> None:
        super().__init__()
        self.dims = dims
        self.traditional = traditional
        self._freqs = freqs

    def __call__(self, x: mx.array, offset: int = 0) -> mx.array:
        return mx.fast.rope(
            x, self.dims, traditional=self.traditional, base=None, scale=1.0, offset=offset, freqs=self._freqs
        )


def rope_frequencies(factors: mx.array, base: float, dims: int) -> mx.array:
    """``Llama3RoPE``'s frequencies for the file's ``factors``: ``base ** (2i / dims) * factor``."""
    return (base ** (mx.arange(0, dims, 2) / dims)) * factors.astype(mx.float32)


def check_factors(factors: mx.array, config: dict[str, Any]) -> str | None:
    """Why ``factors`` cannot be the model's RoPE factors (one per pair of head dimensions)."""
    pairs = config["head_dim"] // 2
    if factors.shape != (pairs,):
        return f"{ROPE_FACTORS} of shape {tuple(factors.shape)} is not mapped (one factor per pair: ({pairs},))"
    return None


def apply_rope_factors(model: nn.Module, config: dict[str, Any], factors: mx.array) -> None:
    """Every attention layer of ``model`` rotating at the frequencies the file's factors give."""
    dims = config["head_dim"]
    freqs = rope_frequencies(factors, config["rope_theta"], dims)
    mx.eval(freqs)
    for layer in model.layers:
        layer.self_attn.rope = FactoredRoPE(dims, config["rope_traditional"], freqs)
