"""Tiny random-weight models of eight mlx-lm architectures, with the demo tokenizer, float32.

Each covers a kind of cache layer the prefix cache must restore exactly: plain KV (llama,
qwen3, qwen3_moe), MLA's latent KV (deepseek_v3), sliding windows (gemma3_text, gpt_oss with
sinks; an 8-token window, so every test prompt outruns it), linear attention (qwen3_next)
and short convolutions (lfm2). Float32, because MLX's CPU backend has no bf16 ``GatherMM``,
which every MoE model needs. Dimensions are tiny so a test stays fast.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

from vllm_mlx_trio.worker.prefix.state_models import ARCHITECTURES as STATE_LAYERS
from vllm_mlx_trio.worker.prefix.state_models import WINDOW

_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "num_hidden_layers": 4,
}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}

CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen3": {},
    "qwen3_moe": {**_MOE, "decoder_sparse_step": 1, "mlp_only_layers": []},
    "deepseek_v3": {
        "moe_intermediate_size": 32,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 8,
        "first_k_dense_replace": 1,
        "topk_method": "noaux_tc",
        "n_group": 1,
        "topk_group": 1,
    },
    "gemma3_text": STATE_LAYERS["gemma3_text"],
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "qwen3_next": STATE_LAYERS["qwen3_next"],
    "lfm2": {
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 16,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 96,
        "full_attn_idxs": [1, 3],
    },
}

ARCHITECTURES = tuple(CONFIGS)

#: Pure-recurrent models (no attention layer): served uncached (tests/prefix/test_recurrent_models.py).
RECURRENT: dict[str, dict[str, Any]] = {
    "mamba2": {
        "num_heads": 4,
        "head_dim": 32,
        "intermediate_size": 128,
        "state_size": 16,
        "n_groups": 1,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "layer_norm_epsilon": 1e-5,
        "time_step_limit": [0.0, 1000.0],
        "time_step_rank": "auto",
        "num_hidden_layers": 2,
    },
    "mamba": {
        "intermediate_size": 128,
        "state_size": 16,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": 8,
        "num_hidden_layers": 2,
    },
}
CONFIGS.update(RECURRENT)
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def build_model(model_type: str, out: pathlib.Path, tokenizer_dir: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Write ``model_type``'s tiny model (config, random float32 weights, the demo tokenizer)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    config = {**_COMMON, **CONFIGS[model_type], "model_type": model_type}
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    weights = dict(tree_flatten(model.parameters()))
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out
