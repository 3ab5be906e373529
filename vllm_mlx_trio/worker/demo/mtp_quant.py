"""``demo:mtp-tiny-q4`` / ``-q8`` and ``demo:mtp-dsv3-q4`` / ``-q8``: the MTP demos with a quantized MTP head.

Real MTP checkpoints on the hub are mostly quantized. These builds write the float demo first (worker/demo/mtp.py,
worker/demo/mtp_dsv3.py), then quantize its MTP tensors the way ``mlx_lm.convert`` quantizes a model: the tensors
are loaded into the head's MLX module (head.py's ``MTPHead``; head_deepseek.py's ``DeepseekMTPLayer`` in mlx-lm's
layout, after mlx-lm's ``sanitize``, with the checkpoint's own copies of the embedding and the head), and MLX's own
``nn.quantize`` packs every layer that has ``to_quantized`` and an input width divisible by the group size, with a
per-layer override where the recipe names one. The result is written back in the same files, each quantized layer
as a packed uint32 ``.weight`` beside its ``.scales`` and ``.biases``, norms and unquantizable layers in float, and
``config.json`` records ``quantization`` (and the same dict as ``quantization_config``) with the overrides keyed by
the checkpoint's layer path. The target stays float: the drafts come from the quantized head, the output from the
target alone. Build time: about a second more than the float demo.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from . import files, mtp, mtp_dsv3
from .recipe import DEMO_MARKER


@attrs.frozen
class QuantizedMTPDemo:
    """One quantized MTP demo: the float demo it starts from and how its head is quantized."""

    #: The float demo's name (``mtp-tiny`` or ``mtp-dsv3``).
    base: str
    bits: int
    group_size: int
    #: Layer path relative to the head -> ``to_quantized`` parameters, or False to keep the layer in float.
    overrides: Mapping[str, dict[str, Any] | bool] = attrs.field(factory=dict)
    #: MLX's quantization mode ("affine": scales and biases; "mxfp4", "mxfp8", "nvfp4": uint8 scales only).
    mode: str = "affine"


#: Each demo keeps one per-layer override on the head's input projection (``fc`` / ``eh_proj``, 2H -> H): 8-bit
#: in the 4-bit builds (a mixed-precision recipe), float in the 8-bit ones (a layer a recipe leaves out).
QUANTIZED_MTP_DEMOS: Mapping[str, QuantizedMTPDemo] = {
    "mtp-tiny-q4": QuantizedMTPDemo("mtp-tiny", bits=4, group_size=32, overrides={"fc": {"group_size": 64, "bits": 8}}),
    "mtp-tiny-q8": QuantizedMTPDemo("mtp-tiny", bits=8, group_size=64, overrides={"fc": False}),
    "mtp-dsv3-q4": QuantizedMTPDemo(
        "mtp-dsv3", bits=4, group_size=32, overrides={"eh_proj": {"group_size": 64, "bits": 8}}
    ),
    "mtp-dsv3-q8": QuantizedMTPDemo("mtp-dsv3", bits=8, group_size=64, overrides={"eh_proj": False}),
}


def write_quantized_mtp(name: str, directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:<name>`` into ``directory``, the marker last (worker/demo/table.py's writer)."""
    write_quantized(QUANTIZED_MTP_DEMOS[name], directory, name=name, seed=seed, dtype=dtype)


def write_quantized(demo: QuantizedMTPDemo, directory: pathlib.Path, *, name: str, seed: int, dtype: str) -> None:
    """Write the float demo ``demo.base`` into ``directory`` with its head quantized by ``demo``; the marker (last)
    records ``name``."""
    write_base, recipe_version, quantize_files = _BASES[demo.base]
    write_base(directory, seed=seed, dtype=dtype)
    (directory / DEMO_MARKER).unlink()  # the float demo's marker: rewritten below, last
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    prefix = quantize_files(directory, config, demo, dtype)
    files.write_json(directory / "config.json", {**config, **quantization_config(demo, prefix)})
    mtp.write_marker(directory, size=name, seed=seed, dtype=dtype, recipe_version=recipe_version)


def quantization_config(demo: QuantizedMTPDemo, prefix: str) -> dict[str, Any]:
    """``config.json``'s ``quantization`` and ``quantization_config``, as ``mlx_lm.convert`` writes them."""
    quantization: dict[str, Any] = {"group_size": demo.group_size, "bits": demo.bits, "mode": demo.mode}
    for path, override in demo.overrides.items():
        quantization[prefix + path] = {"mode": demo.mode, **override} if isinstance(override, dict) else override
    return {"quantization": quantization, "quantization_config": dict(quantization)}


def quantized_tensors(module: Any, weights: dict[str, Any], demo: QuantizedMTPDemo) -> dict[str, Any]:
    """``weights`` loaded into ``module`` and quantized by ``nn.quantize`` with ``mlx_lm.convert``'s rule; the
    module's tensors after (MLX arrays, names relative to the module)."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    module.load_weights(list(weights.items()), strict=True)

    def predicate(path: str, layer: Any) -> dict[str, Any] | bool:
        if not hasattr(layer, "to_quantized"):
            return False
        params = demo.overrides.get(path, True)
        group_size = params["group_size"] if isinstance(params, dict) else demo.group_size
        if params is False or layer.weight.shape[-1] % group_size:
            return False
        return {"mode": demo.mode, **params} if isinstance(params, dict) else True

    nn.quantize(module, group_size=demo.group_size, bits=demo.bits, mode=demo.mode, class_predicate=predicate)
    return dict(tree_flatten(module.parameters()))


def _quantize_qwen_head(directory: pathlib.Path, config: dict[str, Any], demo: QuantizedMTPDemo, dtype: str) -> str:
    """demo:mtp-tiny: the top-level ``mtp.*`` block of ``model.safetensors`` quantized in place."""
    import mlx.core as mx

    from ..speculative.mtp.head import MTP_PREFIX, mtp_head_for

    path = directory / "model.safetensors"
    tensors = mx.load(str(path))
    head_weights = {k[len(MTP_PREFIX) :]: v for k, v in tensors.items() if k.startswith(MTP_PREFIX)}
    quantized = quantized_tensors(mtp_head_for(config["text_config"]), head_weights, demo)
    kept = {k: v for k, v in tensors.items() if not k.startswith(MTP_PREFIX)}
    files.write_safetensors(path, _to_numpy({**kept, **{MTP_PREFIX + k: v for k, v in quantized.items()}}), dtype)
    return MTP_PREFIX


def _quantize_deepseek_layer(
    directory: pathlib.Path, config: dict[str, Any], demo: QuantizedMTPDemo, dtype: str
) -> str:
    """demo:mtp-dsv3: the MTP layer's shard rewritten in mlx-lm's layout, quantized, with its index entries."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import deepseek_v3

    from ..speculative.mtp.head_deepseek import DeepseekMTPLayer, sanitized_layer

    args = deepseek_v3.ModelArgs.from_dict(config)
    prefix = f"model.layers.{args.num_hidden_layers}."
    shard = directory / mtp_dsv3.MTP_SHARD
    weights = sanitized_layer({k[len(prefix) :]: v for k, v in mx.load(str(shard)).items()}, args)
    layer = DeepseekMTPLayer(args, layer_idx=args.num_hidden_layers)
    layer.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)  # the checkpoint's own copies
    layer.shared_head.head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
    quantized = {prefix + k: v for k, v in quantized_tensors(layer, weights, demo).items()}
    files.write_safetensors(shard, _to_numpy(quantized), dtype)
    index_path = directory / "model.safetensors.index.json"
    index = json.loads(index_path.read_text(encoding="utf-8"))
    weight_map = {k: v for k, v in index["weight_map"].items() if not k.startswith(prefix)}
    weight_map.update({k: mtp_dsv3.MTP_SHARD for k in quantized})
    files.write_json(index_path, {**index, "weight_map": dict(sorted(weight_map.items()))})
    return prefix


def _to_numpy(tensors: dict[str, Any]) -> dict[str, np.ndarray]:
    """MLX arrays as numpy: integer ones (packed weights, microscaling scales) as they are, the rest as float32 (a
    bfloat16 tensor exactly)."""
    import mlx.core as mx

    return {k: np.array(v if mx.issubdtype(v.dtype, mx.integer) else v.astype(mx.float32)) for k, v in tensors.items()}


#: base demo -> (its writer, its recipe version, what quantizes its head's files and returns the checkpoint prefix)
_BASES: dict[str, tuple[Callable[..., None], int, Callable[..., str]]] = {
    mtp.MTP_TINY: (mtp.write_mtp_tiny, mtp.MTP_RECIPE_VERSION, _quantize_qwen_head),
    mtp_dsv3.MTP_DSV3: (mtp_dsv3.write_mtp_dsv3, mtp_dsv3.MTP_DSV3_RECIPE_VERSION, _quantize_deepseek_layer),
}
