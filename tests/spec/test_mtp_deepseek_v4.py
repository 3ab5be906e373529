"""The DeepSeek-V4 MTP layout (mlx-lm ``deepseek_v41``): ``method = "mtp"`` refuses it at load with a clear
ModelLoadError (worker/speculative/mtp/head_deepseek_v4.py), and the mlx-lm facts behind the refusal still hold (when
they stop
holding, the refusal is worth revisiting)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import deepseek_v41
from mlx_lm.models.cache import can_trim_prompt_cache

from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.speculative.hidden import PRE_NORM, target_forward
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter, mtp_layout_loader
from vllm_mlx_trio.worker.speculative.mtp.head_deepseek_v4 import load_deepseek_v4_mtp

pytestmark = pytest.mark.mlx

HC_MULT = 2
HIDDEN = 32
#: A tiny deepseek_v41 text config (two window-only layers, two routed experts) carrying one MTP layer.
CONFIG = {
    "model_type": "deepseek_v41",
    "vocab_size": 64,
    "hidden_size": HIDDEN,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "o_groups": 1,
    "o_lora_rank": 16,
    "moe_intermediate_size": 16,
    "n_routed_experts": 2,
    "num_experts_per_tok": 1,
    "sliding_window": 8,
    "compress_ratios": [0, 0],
    "hc_mult": HC_MULT,
    "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 1,
}


@pytest.fixture(scope="module")
def target():
    mx.random.seed(0)
    return deepseek_v41.Model(deepseek_v41.ModelArgs.from_dict(CONFIG))


@pytest.fixture
def checkpoint(tmp_path, target):
    """The target's weights plus an MTP layer's ``mtp.0.*`` tensors (a few of V4's names) in their own shard."""
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(target.parameters())))
    mtp = {f"mtp.0.{name}.weight": mx.zeros((HIDDEN, HIDDEN)) for name in ("e_proj", "h_proj")}
    mtp["mtp.0.enorm.weight"] = mx.ones((HIDDEN,))
    mx.save_safetensors(str(tmp_path / "mtp.safetensors"), mtp)
    (tmp_path / "config.json").write_text(json.dumps(CONFIG), encoding="utf-8")
    return tmp_path


def test_the_layout_table_picks_the_v4_loader():
    assert mtp_layout_loader(CONFIG) is load_deepseek_v4_mtp
    assert mtp_layout_loader({"model_type": "deepseek_v41_text"}) is load_deepseek_v4_mtp  # mlx-lm's remapping


def test_mtp_on_a_v4_checkpoint_is_a_clear_model_load_error(checkpoint, target):
    with pytest.raises(ModelLoadError, match=r"DeepSeek-V4 MTP layout.*deepseek_v41.*hc_mult.*LayerCache"):
        MTPDrafter.for_target(target, checkpoint, hidden_state_mode=None)


def test_the_reasons_for_the_refusal_still_hold(target):
    """The blockers named in the error: the tapped hidden is collapsed (no hc_mult axis), and the target's cache
    can be neither trimmed nor snapshotted."""
    cache = target.make_cache()
    _, hidden = target_forward(target, mx.array([[1, 2, 3]]), cache, mode=PRE_NORM)
    assert hidden.shape == (1, 3, HIDDEN)  # the MTP layer wants (1, 3, HC_MULT, HIDDEN)
    assert not can_trim_prompt_cache(cache)
    assert not hasattr(cache[0], "meta_state")
