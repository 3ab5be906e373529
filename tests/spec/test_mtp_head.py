"""Loading a checkpoint's ``mtp.*`` tensors in Hugging Face layout: zero-centred norms shifted, MoE experts stacked
(Qwen3-Next per-expert matrices) or split (Qwen3.5-MoE fused gate_up_proj) into mlx-lm's switch_mlp."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.speculative.mtp.head import load_mtp_head, mtp_head_for

pytestmark = pytest.mark.mlx

MOE_TEXT = {
    "model_type": "qwen3_next",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 1,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
    "mtp_num_hidden_layers": 1,
}


def _hf_checkpoint(tmp_path, *, fused: bool) -> dict[str, mx.array]:
    """Write an HF-layout checkpoint (conv1d not yet transposed) with an MoE mtp block; return the mlx-side
    weights the head should end up with."""
    head = mtp_head_for(MOE_TEXT)
    expected = {}
    for i, (name, p) in enumerate(tree_flatten(head.parameters())):
        expected[name] = mx.random.normal(p.shape, key=mx.random.key(i))
    stored = {"model.language_model.layers.0.linear_attn.conv1d.weight": mx.zeros((64, 1, 4))}
    for name, value in expected.items():
        if name.endswith("norm.weight") or name.endswith(("norm_embedding.weight", "norm_hidden.weight")):
            stored[f"mtp.{name}"] = value - 1.0  # zero-centred, as the checkpoint stores them
        elif ".switch_mlp." in name:
            continue
        else:
            stored[f"mtp.{name}"] = value
    prefix = "layers.0.mlp"
    gate, up, down = (expected[f"{prefix}.switch_mlp.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
    if fused:
        stored[f"mtp.{prefix}.experts.gate_up_proj"] = mx.concatenate([gate, up], axis=-2)
        stored[f"mtp.{prefix}.experts.down_proj"] = down
    else:
        for e in range(MOE_TEXT["num_experts"]):
            for n, w in (("gate_proj", gate), ("up_proj", up), ("down_proj", down)):
                stored[f"mtp.{prefix}.experts.{e}.{n}.weight"] = w[e]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), stored)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next", **MOE_TEXT}))
    return expected


@pytest.mark.parametrize("fused", [False, True])
def test_an_hf_layout_moe_head_loads(tmp_path, fused):
    expected = _hf_checkpoint(tmp_path, fused=fused)
    head = load_mtp_head(tmp_path, json.loads((tmp_path / "config.json").read_text()))
    loaded = dict(tree_flatten(head.parameters()))
    assert set(loaded) == set(expected)
    for name, value in expected.items():
        assert mx.allclose(loaded[name], value, atol=1e-6).item(), name


def test_a_config_without_mtp_layers_is_refused(tmp_path):
    _hf_checkpoint(tmp_path, fused=True)
    with pytest.raises(ModelLoadError, match="MTP layers"):
        load_mtp_head(tmp_path, {**MOE_TEXT, "mtp_num_hidden_layers": 0})
