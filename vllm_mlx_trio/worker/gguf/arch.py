"""GGUF architectures as mlx-lm models: the config keys and tensor names of each family that
llama.cpp and mlx-lm share.

llama.cpp's converter stores llama's q/k projections permuted for its interleaved RoPE, so a
``llama`` file runs with ``rope_traditional``; qwen2, qwen3 and the Gemma family keep the
Hugging Face layout (NeoX RoPE) and run as mlx-lm's own models do.

Gemma's RMSNorm scales by ``1 + weight``; llama.cpp's converter stores every Gemma norm weight
(names ending ``norm.weight``, q/k norms included) with that 1 added, and mlx-lm adds it at run
time, so the loader takes it off again (:attr:`Architecture.norm_shift`, weights.py). The
embedding's ``sqrt(hidden)`` scale is not in the file: llama.cpp and mlx-lm both apply it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

#: GGUF block-tensor name -> mlx-lm name under ``model.layers.N.`` (the llama layout).
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
#: Gemma 2 and 3 norm both sides of attention and of the MLP: llama.cpp's ``ffn_norm`` is
#: their pre-feedforward norm, and the norms after attention and after the MLP get names of
#: their own.
_SANDWICH_NORM_TENSORS = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.(\w+)$")
_TOP_NAME = re.compile(r"([a-z_]+)\.(\w+)$")
#: Per-dimension RoPE frequency factors (Llama 3's RoPE scaling; rope_factors.py applies them).
ROPE_FACTORS = "rope_freqs.weight"

#: ``key(name, default)``: the file's ``<arch>.<name>`` metadata value.
KeyReader = Callable[..., Any]
#: Config keys of one family read from the file: ``(key, shared config, tensor names) -> keys``;
#: ``KeyError`` with the reason for what the family's mlx-lm model cannot run exactly.
FamilyConfig = Callable[[KeyReader, Mapping[str, Any], set[str]], dict[str, Any]]


def _no_family_keys(key: KeyReader, config: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    return {}


@attrs.frozen
class Architecture:
    """One GGUF ``general.architecture`` served by an mlx-lm ``model_type``."""

    model_type: str
    #: RoPE on interleaved pairs (llama.cpp's permuted q/k) rather than on halves.
    rope_traditional: bool
    #: Config keys this family adds (constant for the family).
    extra: Mapping[str, Any] = attrs.field(factory=dict)
    #: Config keys this family reads from the file.
    family_config: FamilyConfig = _no_family_keys
    #: GGUF block-tensor names whose mlx-lm name differs from the llama layout's.
    block_tensors: Mapping[str, str] = attrs.field(factory=dict)
    #: What llama.cpp's converter added to every norm weight (the loader subtracts it).
    norm_shift: float = 0.0
    #: ``rope.scaling.type`` values the mlx-lm model runs as llama.cpp does.
    rope_scalings: frozenset[str] = frozenset()
    #: Whether a file's :data:`ROPE_FACTORS` tensor is mapped (it sets the model's RoPE frequencies).
    rope_factors: bool = False

    def tensor_name(self, gguf_name: str) -> str:
        """``blk.3.attn_q.scales`` -> ``model.layers.3.self_attn.q_proj.scales``; ``KeyError``
        for a tensor the family's mlx-lm model has no name for."""
        block = _BLOCK_NAME.match(gguf_name)
        if block:
            index, part, leaf = block.groups()
            names = {**_BLOCK_TENSORS, **self.block_tensors}
            if part in names:
                return f"model.layers.{index}.{names[part]}.{leaf}"
        top = _TOP_NAME.match(gguf_name)
        if top and top.group(1) in _TOP_TENSORS:
            return f"{_TOP_TENSORS[top.group(1)]}.{top.group(2)}"
        raise KeyError(f"tensor {gguf_name!r} has no mlx-lm name")


def _refuse_output_tensor(arch_name: str, tensor_names: set[str]) -> None:
    """mlx-lm's gemma and gemma2 models always read their logits off the embedding."""
    if "output.weight" in tensor_names:
        raise KeyError(
            f"architecture {arch_name!r} with its own output.weight is not mapped "
            "(mlx-lm's model ties the output to token_embd)"
        )


#: Layer count of the 27B Gemma 2 / Gemma 3, whose queries llama.cpp scales by
#: ``1/sqrt(hidden / heads)``; every other size by ``1/sqrt(head_dim)``.
_WIDTH_SCALED_QUERY_LAYERS = {"gemma2": 46, "gemma3": 62}


def _query_pre_attn_scalar(arch_name: str, config: Mapping[str, Any]) -> int:
    """mlx-lm's ``query_pre_attn_scalar`` (queries scaled by its inverse square root), chosen
    as llama.cpp chooses it: the file does not record it."""
    if config["num_hidden_layers"] == _WIDTH_SCALED_QUERY_LAYERS[arch_name]:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def _gemma_config(key: KeyReader, config: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    _refuse_output_tensor("gemma", tensor_names)
    return {}


def _gemma2_config(key: KeyReader, config: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """Soft-capping (llama.cpp's defaults 50 and 30 where the file has none) and the query
    scale. The sliding window is kept in the config, but mlx-lm's gemma2 attends to every
    earlier token, as it does for the Hugging Face checkpoint."""
    _refuse_output_tensor("gemma2", tensor_names)
    if key("rope.freq_base_swa", config["rope_theta"]) != config["rope_theta"]:
        raise KeyError("architecture 'gemma2' with its own RoPE base for sliding-window layers is not mapped")
    keys = {
        "attn_logit_softcapping": float(key("attn_logit_softcapping", 50.0)),
        "final_logit_softcapping": float(key("final_logit_softcapping", 30.0)),
        "query_pre_attn_scalar": _query_pre_attn_scalar("gemma2", config),
    }
    if key("attention.sliding_window"):
        keys["sliding_window"] = int(key("attention.sliding_window"))
    return keys


#: Every sixth Gemma 3 layer attends globally (llama.cpp's period where the file names none).
_GEMMA3_SLIDING_PERIOD = 6
#: RoPE base of Gemma 3's sliding-window layers where the file names none (llama.cpp's).
_GEMMA3_LOCAL_ROPE_BASE = 10_000.0


def _gemma3_config(key: KeyReader, config: Mapping[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """Sliding-window layers (window, period, their own RoPE base), the global layers' RoPE
    scaling, and the query scale."""
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if key(cap):
            raise KeyError(f"architecture 'gemma3' with {cap} is not mapped (mlx-lm's gemma3_text has none)")
    window = int(key("attention.sliding_window", 0))
    keys: dict[str, Any] = {
        "query_pre_attn_scalar": _query_pre_attn_scalar("gemma3", config),
        "rope_local_base_freq": float(key("rope.freq_base_swa", _GEMMA3_LOCAL_ROPE_BASE)),
        "sliding_window_pattern": _sliding_period(key, config["num_hidden_layers"]) if window else 1,
    }
    if window:
        keys["sliding_window"] = window
    factor = float(key("rope.scaling.factor", 0.0))
    if key("rope.scaling.type") == "linear" and factor:
        keys["rope_scaling"] = {"rope_type": "linear", "factor": factor}
    return keys


def _sliding_period(key: KeyReader, layers: int) -> int:
    """The period ``p`` of Gemma 3's layers (layer ``i`` attends globally when ``i % p == p - 1``,
    as in llama.cpp's ``set_swa_pattern`` and mlx-lm's gemma3_text), from the file's
    ``attention.sliding_window_pattern``: a period, or one flag per layer (true: sliding)."""
    pattern = key("attention.sliding_window_pattern", _GEMMA3_SLIDING_PERIOD)
    if isinstance(pattern, int) and pattern > 0:
        return pattern
    if isinstance(pattern, list) and len(pattern) == layers:
        for period in range(1, layers + 2):
            if [bool(flag) for flag in pattern] == [i % period != period - 1 for i in range(layers)]:
                return period
    raise KeyError(f"architecture 'gemma3' with sliding-window layers {pattern!r} is not mapped (not periodic)")


ARCHITECTURES: Mapping[str, Architecture] = {
    "llama": Architecture("llama", rope_traditional=True, rope_factors=True),
    "qwen2": Architecture("qwen2", rope_traditional=False),
    "qwen3": Architecture("qwen3", rope_traditional=False),
    "gemma": Architecture("gemma", rope_traditional=False, family_config=_gemma_config, norm_shift=1.0),
    "gemma2": Architecture(
        "gemma2",
        rope_traditional=False,
        family_config=_gemma2_config,
        block_tensors=_SANDWICH_NORM_TENSORS,
        norm_shift=1.0,
    ),
    "gemma3": Architecture(
        "gemma3_text",
        rope_traditional=False,
        family_config=_gemma3_config,
        block_tensors=_SANDWICH_NORM_TENSORS,
        norm_shift=1.0,
        rope_scalings=frozenset({"linear"}),
    ),
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
    _refuse_unmapped(arch_name, arch, key, config, tensor_names)
    config.update(arch.family_config(key, config, tensor_names))
    if "tokenizer.ggml.bos_token_id" in metadata:
        config["bos_token_id"] = int(metadata["tokenizer.ggml.bos_token_id"])
    return config


def eos_token_ids(metadata: Mapping[str, Any]) -> list[int]:
    """The ids that end a reply: the file's EOS, and its end-of-turn token when it names one."""
    ids = [int(metadata[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in metadata]
    return sorted(set(ids))


def _refuse_unmapped(
    arch_name: str, arch: Architecture, key: KeyReader, config: Mapping[str, Any], tensor_names: set[str]
) -> None:
    if ROPE_FACTORS in tensor_names and not arch.rope_factors:
        raise KeyError(
            f"architecture {arch_name!r} with per-dimension RoPE frequency factors (rope_freqs) is not mapped"
        )
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none", *arch.rope_scalings):
        raise KeyError(f"architecture {arch_name!r} with RoPE scaling {scaling!r} is not mapped")
    if key("expert_count"):
        raise KeyError(f"architecture {arch_name!r} with experts (MoE) is not mapped")
    if key("rope.dimension_count", config["head_dim"]) != config["head_dim"]:
        raise KeyError(f"architecture {arch_name!r} with RoPE on part of each head is not mapped")
