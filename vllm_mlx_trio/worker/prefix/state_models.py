"""Random-weight models whose layers keep state besides KV, for ``bench state-snapshots``.

``qwen3_next`` (linear attention between full-attention layers, a mixture of experts) and
``gemma3_text`` (8-token sliding windows between global layers): the layer kinds whose state
the prefix cache snapshots at block boundaries (``cache.state_snapshot_blocks``). Hidden 256,
8 layers, so a prompt of a thousand tokens takes a while to prefill; float32, as MLX's CPU
backend has no bfloat16 ``GatherMM`` (which every mixture of experts needs). The model is
built by mlx-lm's own classes and saved with the demo tokenizer, so ``mlx_lm.load`` reads it
as any checkpoint.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes

#: The sliding window of ``gemma3_text``'s local layers: every prompt outruns it.
WINDOW = 8
_COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "num_hidden_layers": 8,
}
#: Each model's layer-kind settings (the prefix tests' zoo builds the same kinds at its smaller sizes).
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3_next": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 16,
        "linear_value_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 32,
        "mlp_only_layers": [],
        "partial_rotary_factor": 0.5,
        "full_attention_interval": 2,
    },
    "gemma3_text": {
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
        "rope_local_base_freq": 10000.0,
    },
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


def build_state_model(
    model_type: str, out: pathlib.Path, tokenizer_dir: pathlib.Path, *, seed: int = 0
) -> pathlib.Path:
    """Write ``model_type``'s model into ``out``: config, random float32 weights, and the
    tokenizer files of ``tokenizer_dir`` (a demo model's, whose vocabulary is 512 tokens)."""
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {model_type!r}; expected one of {', '.join(ARCHITECTURES)}")
    config = {**_COMMON, **ARCHITECTURES[model_type], "model_type": model_type}
    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(mx.float32)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    for name in _TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out
