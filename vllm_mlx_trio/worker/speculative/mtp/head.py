"""The MTP head of a Qwen3.5 / Qwen3-Next checkpoint as an MLX module, and loading its ``mtp.*`` weights.

``mlx_lm.load`` drops a checkpoint's ``mtp.*`` tensors, so :func:`load_mtp_head` reads them from the safetensors
files itself (only the shards the index names for them). The module mirrors the checkpoint layout (and mlx-vlm's
``Qwen3_5MTPDraftModel``): ``fc(concat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(hidden)))`` through
``mtp_num_hidden_layers`` full-attention decoder layers of the target's own kind (mlx-lm's qwen3_5 ``DecoderLayer``)
and a final ``norm``; the embedding and the head are the target's (shared, see drafter.py). mlx-vlm's own
module is not reused: its layers take mlx-vlm's M-RoPE ``position_ids`` and cache classes and its state machine
drives mlx-vlm's round loop, while this one runs on mlx-lm's ``KVCache`` beside an mlx-lm target.
MLX thread only.
"""

from __future__ import annotations

import json
import pathlib
import re
import struct
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3_5 import DecoderLayer, TextModelArgs

from ....errors import ModelLoadError
from .quantized import head_quantization, quantize_head

MTP_PREFIX = "mtp."
#: Norm weights that real (Hugging Face layout) Qwen3.5 / Qwen3-Next checkpoints store zero-centred (w - 1): the
#: same rule mlx-lm's qwen3_5 sanitize applies to the target's norms and mlx-vlm's splitter to the ``mtp.*`` ones.
ZERO_CENTRED_NORMS = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)


class MTPHead(nn.Module):
    """One MTP module: (target hidden at position i, embedding of token i+1) -> hidden that predicts token i+2."""

    def __init__(self, args: TextModelArgs, depth: int):
        super().__init__()
        hidden = args.hidden_size
        layer_args = replace(args, num_hidden_layers=depth, full_attention_interval=1)  # every layer attends
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.layers = [DecoderLayer(layer_args, layer_idx=0) for _ in range(depth)]
        self.norm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)

    def __call__(self, token_embed: mx.array, hidden: mx.array, cache: list[KVCache]) -> mx.array:
        h = mx.concatenate([self.pre_fc_norm_embedding(token_embed), self.pre_fc_norm_hidden(hidden)], axis=-1)
        h = self.fc(h)
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            h = layer(h, mask=create_attention_mask(h, layer_cache), cache=layer_cache)
        return self.norm(h)

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]


def text_config_of(config: dict[str, Any]) -> dict[str, Any]:
    """The text part of a model config (``text_config`` of a multimodal config, else the config itself)."""
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def mtp_depth(text_config: dict[str, Any]) -> int:
    """How many MTP layers the checkpoint carries (0: none)."""
    return int(text_config.get("mtp_num_hidden_layers") or text_config.get("num_nextn_predict_layers") or 0)


def mtp_head_for(text_config: dict[str, Any]) -> MTPHead:
    """An MTP head with fresh (lazy) weights for ``text_config``."""
    depth = mtp_depth(text_config)
    if depth <= 0:
        raise ModelLoadError("the model config declares no MTP layers (mtp_num_hidden_layers)")
    return MTPHead(TextModelArgs.from_dict(text_config), depth)


def load_mtp_head(model_dir: str | pathlib.Path, config: dict[str, Any]) -> MTPHead:
    """The checkpoint's MTP head with its ``mtp.*`` weights loaded (in the checkpoint's dtype; the layers the
    checkpoint stores quantized are quantized as its config says, see quantized.py)."""
    model_dir = pathlib.Path(model_dir)
    headers = {path: safetensors_shapes(path) for path in _weight_files(model_dir)}
    files = [path for path, shapes in headers.items() if any(k.startswith(MTP_PREFIX) for k in shapes)]
    if not files:
        raise ModelLoadError(f'{model_dir}: the checkpoint carries no mtp.* weights (method = "mtp" needs them)')
    head = mtp_head_for(text_config_of(config))
    weights: dict[str, mx.array] = {}
    for path in files:
        weights.update({k[len(MTP_PREFIX) :]: v for k, v in mx.load(str(path)).items() if k.startswith(MTP_PREFIX)})
    weights = _stack_experts(weights)
    if _is_hf_layout(headers):
        weights = {k: (v + 1.0 if v.ndim == 1 and k.endswith(ZERO_CENTRED_NORMS) else v) for k, v in weights.items()}
    try:
        quantize_head(head, weights, head_quantization(config), prefix=MTP_PREFIX)
        head.load_weights(list(weights.items()), strict=True)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{model_dir}: {exc}") from None
    except ValueError as exc:
        raise ModelLoadError(f"{model_dir}: the mtp.* weights do not fit the MTP head: {exc}") from exc
    mx.eval(head.parameters())
    return head


def _weight_files(model_dir: pathlib.Path) -> list[pathlib.Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        names = sorted({f for k, f in weight_map.items() if k.startswith(MTP_PREFIX) or "conv1d" in k})
        return [model_dir / name for name in names]
    return sorted(model_dir.glob("*.safetensors"))


def safetensors_shapes(path: pathlib.Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a safetensors file's header, without reading the tensors."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def _is_hf_layout(headers: dict[pathlib.Path, dict[str, list[int]]]) -> bool:
    """As mlx-lm's qwen3_5 sanitize decides: a conv1d weight not yet in MLX layout marks an unconverted checkpoint."""
    return any("conv1d.weight" in k and shape[-1] != 1 for shapes in headers.values() for k, shape in shapes.items())


_EXPERT = re.compile(r"^(layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(weight|scales|biases)$")


def _stack_experts(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """MoE MTP layers in Hugging Face layout to mlx-lm's ``switch_mlp``: Qwen3-Next's per-expert matrices (and their
    scales and biases where quantized) are stacked, Qwen3.5-MoE's fused ``experts.gate_up_proj`` is split (as
    mlx-lm's sanitize does for the target)."""
    out: dict[str, mx.array] = {}
    per_expert: dict[tuple[str, str], dict[int, mx.array]] = {}
    for key, value in weights.items():
        if match := _EXPERT.match(key):
            per_expert.setdefault((match[1], f"{match[3]}.{match[4]}"), {})[int(match[2])] = value
        elif key.endswith(".mlp.experts.gate_up_proj"):
            prefix, mid = key[: -len(".experts.gate_up_proj")], value.shape[-2] // 2
            out[f"{prefix}.switch_mlp.gate_proj.weight"] = value[..., :mid, :]
            out[f"{prefix}.switch_mlp.up_proj.weight"] = value[..., mid:, :]
        elif key.endswith(".mlp.experts.down_proj"):
            out[f"{key[: -len('.experts.down_proj')]}.switch_mlp.down_proj.weight"] = value
        else:
            out[key] = value
    for (prefix, name), experts in per_expert.items():
        out[f"{prefix}.switch_mlp.{name}"] = mx.stack([experts[e] for e in sorted(experts)])
    return out
