"""The MTP head of a DeepSeek-V3-style checkpoint (DeepSeek-V3 / V3.1 / R1, Kimi-K2) as an MLX module, and its loader.

Such a checkpoint stores its MTP module as one more decoder layer, index ``N = num_hidden_layers`` (config
``num_nextn_predict_layers: 1``): ``model.layers.{N}.enorm`` and ``.hnorm`` (RMSNorms), ``.eh_proj`` (Linear 2H -> H
over ``concat(enorm(embed(token)), hnorm(hidden))``, in that order), the usual decoder layer (``self_attn.*`` MLA,
``mlp.*`` MoE or dense, ``input_layernorm``, ``post_attention_layernorm``), ``.shared_head.norm``,
``.shared_head.head`` and ``.embed_tokens`` (the last two usually copies of the model's). mlx-lm's deepseek_v3
``sanitize`` drops the layer, so :func:`load_deepseek_mtp` reads it from the shards the safetensors index names for
``model.layers.{N}.`` and converts it with that same ``sanitize`` (fp8 dequantisation, per-expert matrices stacked
into ``switch_mlp``, ``kv_b_proj`` split into MLA's ``embed_q`` / ``unembed_out``), applied to the layer renamed to
index 0. The module is mlx-lm's own ``DeepseekV3DecoderLayer`` (so MLA and MoE are the target's) plus the MTP parts.

As vLLM's ``deepseek_mtp.py`` does, a draft step returns the layer's output before ``shared_head.norm`` (the residual
stream the next draft step chains on); the logits come from ``shared_head.head(shared_head.norm(h))``. The embedding
and the head are the target's where the checkpoint's copies are identical or absent, else the checkpoint's own.
MLX thread only.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import deepseek_v3
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from ....errors import ModelLoadError
from .head import safetensors_shapes, text_config_of
from .quantized import head_quantization, quantize_head

#: The tensors of the checkpoint's copies of the embedding and the head (``embed_tokens.*``, ``shared_head.head.*``)
#: that :func:`_same` compares with the target's: the weight, and its scales and biases where quantized.
_COPY_TENSORS = ("weight", "scales", "biases")


class DeepseekMTPLayer(deepseek_v3.DeepseekV3DecoderLayer):
    """One DeepSeek-V3 MTP module: (target hidden at position i, embedding of token i+1) -> hidden for token i+2."""

    def __init__(self, args: deepseek_v3.ModelArgs, layer_idx: int):
        super().__init__(args, layer_idx)  # MoE where the target's layer ``layer_idx`` would be MoE
        hidden = args.hidden_size
        self.enorm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.hnorm = nn.RMSNorm(hidden, eps=args.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.shared_head = SharedHead(args)

    def draft(self, token_embed: mx.array, hidden: mx.array, cache: list[KVCache]) -> mx.array:
        """The layer's output (before ``shared_head.norm``) for the pairs (``hidden[i]``, ``token_embed[i]``)."""
        h = self.eh_proj(mx.concatenate([self.enorm(token_embed), self.hnorm(hidden)], axis=-1))
        return super().__call__(h, create_attention_mask(h, cache[0], return_array=True), cache[0])

    def make_cache(self) -> list[KVCache]:
        return [KVCache()]  # MLA's latent and rope key, as mlx-lm's deepseek_v3 caches them


class SharedHead(nn.Module):
    """``shared_head``: its norm always; its ``head`` only when the checkpoint's differs from the target's."""

    def __init__(self, args: deepseek_v3.ModelArgs):
        super().__init__()
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)


class DeepseekMTPHead:
    """The drafter's view of the layer (the interface of worker/speculative/mtp/head.py's ``MTPHead``)."""

    def __init__(self, layer: DeepseekMTPLayer):
        self.layer = layer

    def __call__(self, token_embed: mx.array, hidden: mx.array, cache: list[KVCache]) -> mx.array:
        return self.layer.draft(token_embed, hidden, cache)

    def make_cache(self) -> list[KVCache]:
        return self.layer.make_cache()


#: The target's token embedding and output head.
Shared = tuple[Callable[[mx.array], mx.array], Callable[[mx.array], mx.array]]
#: What a head loader returns: the head, the token embedding it takes, and hidden -> logits.
LoadedHead = tuple[Any, Callable[[mx.array], mx.array], Callable[[mx.array], mx.array]]


def deepseek_mtp_depth(text_config: dict[str, Any]) -> int:
    return int(text_config.get("num_nextn_predict_layers") or 0)


def load_deepseek_mtp(model_dir: str | pathlib.Path, config: dict[str, Any], shared: Shared) -> LoadedHead:
    """The checkpoint's first MTP layer (``model.layers.{num_hidden_layers}``) as a head; every draft step uses it
    (DeepSeek-V3 carries one). ``shared``: the target's embedding and output head."""
    model_dir = pathlib.Path(model_dir)
    text = text_config_of(config)
    if deepseek_mtp_depth(text) <= 0:
        raise ModelLoadError(f"{model_dir}: the model config declares no MTP layers (num_nextn_predict_layers)")
    args = deepseek_v3.ModelArgs.from_dict(text)
    prefix = f"model.layers.{args.num_hidden_layers}."
    raw = _read_prefixed(model_dir, prefix)
    if not raw:
        raise ModelLoadError(
            f'{model_dir}: the checkpoint carries no {prefix}* weights (method = "mtp" reads its MTP layer there)'
        )
    weights = sanitized_layer(raw, args)
    layer = DeepseekMTPLayer(args, layer_idx=args.num_hidden_layers)
    _attach_own_copies(layer, weights, shared, args)
    try:
        quantize_head(layer, weights, head_quantization(config), prefix=prefix)
        layer.load_weights(list(weights.items()), strict=True)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{model_dir}: {exc}") from None
    except ValueError as exc:
        raise ModelLoadError(f"{model_dir}: the {prefix}* weights do not fit the MTP layer: {exc}") from exc
    mx.eval(layer.parameters())
    embed = layer.get("embed_tokens", shared[0])  # looked up after quantize_head, which replaces the modules
    lm_head, norm = layer.shared_head.get("head", shared[1]), layer.shared_head.norm
    return DeepseekMTPHead(layer), embed, lambda hidden: lm_head(norm(hidden))


def sanitized_layer(raw: dict[str, mx.array], args: deepseek_v3.ModelArgs) -> dict[str, mx.array]:
    """The layer's tensors (names relative to it) in mlx-lm's layout, through mlx-lm's own deepseek_v3 ``sanitize``
    run on the layer renamed to index 0 of a one-layer model (its other rules keep away from index 0)."""
    one_layer = SimpleNamespace(args=deepseek_v3.ModelArgs.from_dict({**vars(args), "num_hidden_layers": 1}))
    renamed = {f"model.layers.0.{k}": v for k, v in raw.items()}
    out = deepseek_v3.Model.sanitize(one_layer, renamed)
    return {k[len("model.layers.0.") :]: v for k, v in out.items()}


def _attach_own_copies(
    layer: DeepseekMTPLayer, weights: dict[str, mx.array], shared: Shared, args: deepseek_v3.ModelArgs
) -> None:
    """Take the checkpoint's copies of the embedding and the head (with their scales and biases where quantized)
    out of ``weights``; where one differs from the target's, give the layer its own ``embed_tokens`` /
    ``shared_head.head`` (float here: :func:`quantize_head` then quantizes it as stored) and put the copy back."""
    embed, lm_head = shared
    own_embed, own_head = _pop_copy(weights, "embed_tokens."), _pop_copy(weights, "shared_head.head.")
    if own_embed and not _same(own_embed, embed):
        layer.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        weights.update({f"embed_tokens.{name}": value for name, value in own_embed.items()})
    if own_head and not _same(own_head, lm_head):
        layer.shared_head.head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        weights.update({f"shared_head.head.{name}": value for name, value in own_head.items()})


def _pop_copy(weights: dict[str, mx.array], module_path: str) -> dict[str, mx.array]:
    """The tensors of one shared copy (``weight``, and ``scales`` / ``biases`` where quantized), taken out."""
    return {name: weights.pop(module_path + name) for name in _COPY_TENSORS if module_path + name in weights}


def _same(own: dict[str, mx.array], target_module: Any) -> bool:
    """Whether the checkpoint's copy holds the target module's tensors: both float and equal (after a cast to the
    target's dtype), or both quantized alike and bit-equal. A tied head (a bound ``as_linear``) is never the same."""
    if not isinstance(target_module, nn.Module):
        return False
    for name in _COPY_TENSORS:
        mine, theirs = own.get(name), target_module.get(name)
        if mine is None or theirs is None:
            if (mine is None) != (theirs is None):
                return False
            continue
        if mine.shape != theirs.shape or mine.dtype == mx.uint32 and theirs.dtype != mx.uint32:
            return False
        if not mx.array_equal(mine.astype(theirs.dtype), theirs).item():
            return False
    return True


def _read_prefixed(model_dir: pathlib.Path, prefix: str) -> dict[str, mx.array]:
    """The tensors named ``prefix*``, names without the prefix, read only from the shards that hold them."""
    out: dict[str, mx.array] = {}
    for path in _shards_with(model_dir, prefix):
        out.update({k[len(prefix) :]: v for k, v in mx.load(str(path)).items() if k.startswith(prefix)})
    return out


def _shards_with(model_dir: pathlib.Path, prefix: str) -> list[pathlib.Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return [model_dir / name for name in sorted({f for k, f in weight_map.items() if k.startswith(prefix)})]
    files = sorted(model_dir.glob("*.safetensors"))
    return [path for path in files if any(k.startswith(prefix) for k in safetensors_shapes(path))]
