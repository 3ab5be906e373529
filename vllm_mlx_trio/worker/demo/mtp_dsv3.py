"""``demo:mtp-dsv3``: a tiny DeepSeek-V3 target (MLA, one dense and one MoE layer) carrying a DeepSeek-V3-layout MTP
layer that agrees with it often.

The target is mlx-lm's ``deepseek_v3`` architecture (hidden size 64, MLA with a low-rank query, 4 routed experts +
1 shared), stored float32 (MLX's CPU backend has no bfloat16 GatherMM, which the MoE layers need) in the Hugging Face
layout of a real DeepSeek-V3 checkpoint: per-expert ``mlp.experts.{e}.*`` matrices and ``self_attn.kv_b_proj``, which
mlx-lm's ``sanitize`` converts. The MTP module is layer ``N = num_hidden_layers`` (``num_nextn_predict_layers: 1``):
``model.layers.2.{enorm, hnorm, eh_proj, self_attn.*, mlp.*, input_layernorm, post_attention_layernorm,
shared_head.norm, shared_head.head, embed_tokens}``, the last two copies of the target's, as DeepSeek-V3 ships them.

mlx-lm 0.32.2's deepseek_v3 ``sanitize`` drops only ``model.layers.61`` (DeepSeek-V3's own N), so a layer 2 in a
``model*.safetensors`` file would fail ``mlx_lm.load``'s strict load: the MTP layer lives in ``mtp.safetensors``,
which ``mlx_lm.load`` does not read and ``model.safetensors.index.json`` names (the MTP loader reads the index).

Agreement is constructed as demo:mtp-tiny's (worker/demo/mtp.py): small output projections keep each token's
embedding on top of the residual stream, so the target's next token is mostly a function of the current one; the MTP
layer's ``eh_proj`` passes the normed embedding of the next token through (plus a small share of the hidden state),
so it predicts the token after next with the same function. Build time: about a second.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from . import files, recipe
from .mtp import (
    LAYER_OUTPUT_SCALE,
    MTP_HIDDEN_SHARE,
    MTP_LAYER_OUTPUT_SCALE,
    tokenizer_and_ids,
    write_marker,
    write_tokenizer_side,
)

#: The demo name (``demo:mtp-dsv3``).
MTP_DSV3 = "mtp-dsv3"
#: Bump when the recipe changes; recorded in the marker.
MTP_DSV3_RECIPE_VERSION = 1
#: The file holding the MTP layer (not ``model*.safetensors``: see the module docstring).
MTP_SHARD = "mtp.safetensors"
TARGET_SHARD = "model.safetensors"
_OUTPUT_PROJECTIONS = ("o_proj.weight", "down_proj.weight")

#: The config of the target (DeepSeek-V3 field names, read by mlx-lm's deepseek_v3 ``ModelArgs``).
CONFIG: dict[str, Any] = {
    "model_type": "deepseek_v3",
    "architectures": ["DeepseekV3ForCausalLM"],
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,  # layer 0 dense, 1 and the MTP MoE
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 48,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 1,
    "topk_group": 1,
    "max_position_embeddings": 2048,
    "rms_norm_eps": recipe.RMS_NORM_EPS,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "num_nextn_predict_layers": 1,
}


def write_mtp_dsv3(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:mtp-dsv3`` into ``directory``, the marker last (worker/demo/table.py's writer)."""
    tokenizer, ids = tokenizer_and_ids(CONFIG["vocab_size"])
    config = {**CONFIG, "torch_dtype": dtype, "bos_token_id": ids[files.ENDOFTEXT], "eos_token_id": ids[files.IM_END]}
    weights = to_hf_layout(constructed_weights(config, seed, files.damped_ids(tokenizer)), config)
    mtp_prefix = f"model.layers.{config['num_hidden_layers']}."
    shards = {
        TARGET_SHARD: {k: v for k, v in weights.items() if not k.startswith(mtp_prefix)},
        MTP_SHARD: {k: v for k, v in weights.items() if k.startswith(mtp_prefix)},
    }
    for name, tensors in shards.items():
        files.write_safetensors(directory / name, tensors, dtype)
    weight_map = {key: name for name, tensors in shards.items() for key in sorted(tensors)}
    files.write_json(directory / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    files.write_json(directory / "config.json", config)
    write_tokenizer_side(directory, tokenizer, ids, CONFIG["max_position_embeddings"])
    write_marker(directory, size=MTP_DSV3, seed=seed, dtype=dtype, recipe_version=MTP_DSV3_RECIPE_VERSION)


def mlx_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names and shapes in mlx-lm's layout: the deepseek_v3 target and the MTP layer under ``model.layers.{N}.``."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import deepseek_v3

    from ..speculative.mtp.head_deepseek import DeepseekMTPLayer

    args = deepseek_v3.ModelArgs.from_dict(config)
    shapes = {name: tuple(p.shape) for name, p in tree_flatten(deepseek_v3.Model(args).parameters())}
    prefix = f"model.layers.{args.num_hidden_layers}."
    layer = DeepseekMTPLayer(args, layer_idx=args.num_hidden_layers)
    shapes.update({prefix + name: tuple(p.shape) for name, p in tree_flatten(layer.parameters())})
    return shapes


def constructed_weights(config: dict[str, Any], seed: int, damped_ids: list[int]) -> dict[str, np.ndarray]:
    """Float32 weights in mlx-lm's layout, drawn in sorted-name order from ``default_rng(seed)``, shaped as the
    module docstring says; the MTP layer's ``embed_tokens`` and ``shared_head.head`` copy the target's."""
    hidden, mtp = config["hidden_size"], f"model.layers.{config['num_hidden_layers']}."
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in sorted(mlx_shapes(config).items()):
        if name.endswith("norm.weight"):
            final = name in ("model.norm.weight", f"{mtp}shared_head.norm.weight")
            weights[name] = np.full(shape, recipe.LOGIT_STD if final else 1.0, dtype=np.float32)
        elif name.endswith("e_score_correction_bias"):
            weights[name] = np.zeros(shape, dtype=np.float32)
        elif name == "model.embed_tokens.weight":
            weights[name] = rng.standard_normal(shape, dtype=np.float32)
        else:
            std = shape[-1] ** -0.5
            if name.endswith(_OUTPUT_PROJECTIONS):
                std *= MTP_LAYER_OUTPUT_SCALE if name.startswith(mtp) else LAYER_OUTPUT_SCALE
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights["lm_head.weight"][damped_ids] *= np.float32(recipe.SPECIAL_ROW_SCALE)
    eh_proj = weights[f"{mtp}eh_proj.weight"]  # (hidden, 2 * hidden): [embedding half | hidden half]
    eh_proj[:, :hidden] = np.eye(hidden, dtype=np.float32)
    eh_proj[:, hidden:] *= np.float32(MTP_HIDDEN_SHARE)
    weights[f"{mtp}embed_tokens.weight"] = weights["model.embed_tokens.weight"].copy()
    weights[f"{mtp}shared_head.head.weight"] = weights["lm_head.weight"].copy()
    return weights


def to_hf_layout(weights: dict[str, np.ndarray], config: dict[str, Any]) -> dict[str, np.ndarray]:
    """mlx-lm's layout back to the checkpoint's (what its deepseek_v3 ``sanitize`` undoes): MLA's ``embed_q`` /
    ``unembed_out`` joined into ``kv_b_proj``, ``switch_mlp`` split into per-expert matrices."""
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        if name.endswith(".self_attn.embed_q.weight"):
            prefix = name[: -len("embed_q.weight")]
            wk = value.swapaxes(-1, -2)  # (heads, qk_nope, kv_lora)
            wv = weights[prefix + "unembed_out.weight"]  # (heads, v_head, kv_lora)
            out[prefix + "kv_b_proj.weight"] = np.concatenate([wk, wv], axis=1).reshape(-1, wk.shape[-1])
        elif name.endswith(".self_attn.unembed_out.weight"):
            continue
        elif ".mlp.switch_mlp." in name:
            prefix, proj = name.split(".switch_mlp.")
            for expert in range(value.shape[0]):
                out[f"{prefix}.experts.{expert}.{proj}"] = np.ascontiguousarray(value[expert])
        else:
            out[name] = value
    return out
