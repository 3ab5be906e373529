"""GGUF architectures as mlx-lm models: the config keys and tensor names of each family that
llama.cpp and mlx-lm share.

llama.cpp's converter stores llama's q/k projections permuted for its interleaved RoPE, so a
``llama`` file runs with ``rope_traditional``; qwen2 and qwen3 files keep the Hugging Face
layout (NeoX RoPE) and run as mlx-lm's own models do.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

#: GGUF block-tensor name -> mlx-lm name under ``model.layers.N.``.
_BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(\w+)$")
_TOP_NAME = re.compile(r"([a-z_]+)\.(\w+)$")


@attrs.frozen
class Architecture:
    """One GGUF ``general.architecture`` served by an mlx-lm ``model_type``."""

    model_type: str
    #: RoPE on interleaved pairs (llama.cpp's permuted q/k) rather than on halves.
    rope_traditional: bool
    #: Config keys this family adds (constant for the family).
    extra: Mapping[str, Any] = attrs.field(factory=dict)


ARCHITECTURES: Mapping[str, Architecture] = {
    "llama": Architecture("llama", rope_traditional=True),
    "qwen2": Architecture("qwen2", rope_traditional=False),
    "qwen3": Architecture("qwen3", rope_traditional=False),
}


def architecture(name: str) -> Architecture:
    """The mapping for ``name``, or ``KeyError`` listing the supported ones."""
    try:
        return ARCHITECTURES[name]
    except KeyError:
        supported = ", ".join(ARCHITECTURES)
        raise KeyError(f"architecture {name!r} is not mapped (supported: {supported})") from None


def hf_config(metadata: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """The mlx-lm ``config.json`` of a GGUF file, from its metadata and tensor names."""
    arch_name = str(metadata["general.architecture"])
    arch = architecture(arch_name)
    _refuse_unmapped(arch_name, metadata, tensor_names)

    def key(name: str, default: Any = None) -> Any:
        return metadata.get(f"{arch_name}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    vocab = int(key("vocab_size", len(metadata["tokenizer.ggml.tokens"])))
    config: dict[str, Any] = {
        "model_type": arch.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(key("block_count")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10_000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "rope_traditional": arch.rope_traditional,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "eos_token_id": eos_token_ids(metadata),
        **arch.extra,
    }
    if "tokenizer.ggml.bos_token_id" in metadata:
        config["bos_token_id"] = int(metadata["tokenizer.ggml.bos_token_id"])
    return config


def eos_token_ids(metadata: Mapping[str, Any]) -> list[int]:
    """The ids that end a reply: the file's EOS, and its end-of-turn token when it names one."""
    ids = [int(metadata[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in metadata]
    return sorted(set(ids))


def _refuse_unmapped(arch_name: str, metadata: Mapping[str, Any], tensor_names: set[str]) -> None:
    scaling = metadata.get(f"{arch_name}.rope.scaling.type")
    if "rope_freqs.weight" in tensor_names or scaling not in (None, "none"):
        what = "per-dimension RoPE frequency factors (rope_freqs)" if scaling is None else f"RoPE scaling {scaling!r}"
        raise KeyError(f"architecture {arch_name!r} with {what} is not mapped")
    if metadata.get(f"{arch_name}.expert_count"):
        raise KeyError(f"architecture {arch_name!r} with experts (MoE) is not mapped")


def mlx_tensor_name(gguf_name: str) -> str:
    """``blk.3.attn_q.scales`` -> ``model.layers.3.self_attn.q_proj.scales``; ``KeyError`` for
    a tensor no mapped family has."""
    block = _BLOCK_NAME.match(gguf_name)
    if block:
        index, part, leaf = block.groups()
        if part in _BLOCK_TENSORS:
            return f"model.layers.{index}.{_BLOCK_TENSORS[part]}.{leaf}"
    top = _TOP_NAME.match(gguf_name)
    if top and top.group(1) in _TOP_TENSORS:
        return f"{_TOP_TENSORS[top.group(1)]}.{top.group(2)}"
    raise KeyError(f"tensor {gguf_name!r} has no mlx-lm name")
