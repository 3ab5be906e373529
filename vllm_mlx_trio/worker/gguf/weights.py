"""A GGUF file's tensors in an mlx-lm model: renamed, norm weights given back the values the
model's own checkpoint holds (arch.py's ``norm_shift``), kept quantized where MLX's affine layout
matches (Q4_0, Q4_1, Q8_0 as 4/8 bits, group 32), or dequantized into one float dtype. A llama
file's RoPE frequency factors (rope_factors.py) stay under their GGUF name, in float32, and set
the model's RoPE frequencies instead of loading as a weight."""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, infer_quant_config

from .arch import ROPE_FACTORS, architecture
from .file import GGUFError, GGUFHeader
from .rope_factors import apply_rope_factors, check_factors

logger = logging.getLogger(__name__)

#: Values in one quantization block of every native GGUF format (MLX's group size for them).
GGUF_BLOCK = 32
#: ``[model] gguf_dtype`` values that dequantize, and the MLX dtype each means.
FLOAT_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def read_tensors(header: GGUFHeader, config: dict[str, Any]) -> dict[str, mx.array]:
    """Every tensor of the file under its mlx-lm name (``.weight`` / ``.scales`` / ``.biases``),
    as the architecture's mlx-lm model (``config``, the file's mapped config) reads them."""
    arrays = mx.load(str(header.path))
    if "BF16" in header.tensor_types.values():
        arrays.update(_bfloat16_tensors(header.path))
    arch = architecture(header.architecture)
    tensors = {name if name == ROPE_FACTORS else arch.tensor_name(name): array for name, array in arrays.items()}
    if ROPE_FACTORS in tensors:
        _check_rope_factors(header, tensors[ROPE_FACTORS], config)
    return _unshifted_norms(header, tensors, arch.norm_shift) if arch.norm_shift else tensors


def _check_rope_factors(header: GGUFHeader, factors: mx.array, config: dict[str, Any]) -> None:
    """:class:`GGUFError` naming the file for RoPE factors the model cannot take."""
    if reason := check_factors(factors, config):
        raise GGUFError(f"{header.path}: {reason}")


def _unshifted_norms(header: GGUFHeader, tensors: dict[str, mx.array], shift: float) -> dict[str, mx.array]:
    """``tensors`` with ``shift`` taken off every norm weight (computed in float32, kept in the
    tensor's dtype): llama.cpp's converter added it, and the mlx-lm model adds it at run time."""
    out = dict(tensors)
    for name, array in tensors.items():
        if not name.endswith("norm.weight"):
            continue
        if name.removesuffix(".weight") + ".scales" in tensors:
            raise GGUFError(f"{header.path}: norm {name!r} is stored quantized; only float norms are mapped")
        out[name] = (array.astype(mx.float32) - shift).astype(array.dtype)
    return out


def _bfloat16_tensors(path: pathlib.Path) -> dict[str, mx.array]:
    """The file's BF16 tensors as stored: ``mx.load`` casts them to float16, where values past
    65504 become inf and a bfloat16 model would compute in float16."""
    from gguf import GGMLQuantizationType, GGUFReader

    tensors = [t for t in GGUFReader(path).tensors if t.tensor_type == GGMLQuantizationType.BF16]
    return {t.name: mx.array(np.asarray(t.data).view(np.uint16)).view(mx.bfloat16) for t in tensors}


def dequantized(weights: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    """The same weights as plain ``dtype`` tensors (a packed weight with its scales and biases
    becomes one matrix, computed in float32: the file's float16 scales times its integers are
    exact there, and would round in float16)."""
    out: dict[str, mx.array] = {}
    for name, array in weights.items():
        if name == ROPE_FACTORS:
            out[name] = array
            continue
        if name.endswith((".scales", ".biases")):
            continue
        prefix = name.removesuffix(".weight")
        if f"{prefix}.scales" in weights:
            scales, biases = weights[f"{prefix}.scales"], weights[f"{prefix}.biases"]
            bits = array.shape[-1] * 32 // (scales.shape[-1] * GGUF_BLOCK)
            scales, biases = scales.astype(mx.float32), biases.astype(mx.float32)
            array = mx.dequantize(array, scales, biases, group_size=GGUF_BLOCK, bits=bits)
        out[name] = array.astype(dtype)
    return out


def build_model(config: dict[str, Any], weights: dict[str, mx.array]) -> nn.Module:
    """mlx-lm's model for ``config`` with ``weights`` loaded, quantized layers where the weights
    are packed (their bits read from each tensor's shape, as mlx-lm does for a mixed checkpoint),
    and its RoPE frequencies from the file's factors where it has them."""
    weights = dict(weights)
    factors = weights.pop(ROPE_FACTORS, None)
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights

    def packed(path: str, module: nn.Module) -> Any:
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return infer_quant_config(path, module, weights)

    nn.quantize(model, class_predicate=packed)
    model.eval()
    model.load_weights(list(weights.items()), strict=True)
    if factors is not None:
        apply_rope_factors(model, config, factors)
    mx.eval(model.parameters())
    return model


def weight_bytes(model: nn.Module) -> int:
    """The loaded parameters' size in bytes."""
    return sum(array.nbytes for _, array in tree_flatten(model.parameters()))
