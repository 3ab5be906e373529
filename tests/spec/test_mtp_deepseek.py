"""The DeepSeek-V3 MTP layout on demo:mtp-dsv3: the checkpoint's layout, the layout table, the loader (only the
index's shards, mlx-lm's sanitize, shared or own embedding/head, a missing layer refused) and the drafter driven by a
greedy verify loop (output identical to plain greedy, drafts accepted)."""

from __future__ import annotations

import hashlib
import json
import shutil

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from mlx.utils import tree_flatten

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.demo import DEMO_MARKER, resolve_demo_model
from vllm_mlx_trio.worker.demo import mtp_dsv3 as demo_mtp_dsv3
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter, mtp_layout_loader
from vllm_mlx_trio.worker.speculative.mtp.head import safetensors_shapes
from vllm_mlx_trio.worker.speculative.mtp.head_deepseek import DeepseekMTPHead, load_deepseek_mtp

from .mtp_parts import plain_greedy, speculative_greedy

pytestmark = pytest.mark.mlx

PROMPTS = ("Once upon a time", "The quick brown fox jumps", "In a hole in the ground there lived")
NEW_TOKENS = 40
MTP = "model.layers.2."  # num_hidden_layers = 2


@pytest.fixture(scope="module")
def demo_dir(demo_cache_dir):
    return resolve_demo_model("demo:mtp-dsv3", demo_cache_dir)


@pytest.fixture(scope="module")
def target(demo_dir):
    model, tokenizer = mlx_lm.load(str(demo_dir))
    return model, tokenizer


def test_mlx_lm_loads_the_target_and_the_checkpoint_has_the_deepseek_v3_layout(demo_dir, target):
    model, tokenizer = target
    assert type(model).__module__ == "mlx_lm.models.deepseek_v3" and len(model.layers) == 2
    assert type(model.layers[1].mlp).__name__ == "DeepseekV3MoE"  # MLA + a MoE layer
    assert mlx_lm.generate(model, tokenizer, "Once upon a time", max_tokens=4)
    shapes = safetensors_shapes(demo_dir / demo_mtp_dsv3.MTP_SHARD)
    assert {
        f"{MTP}{name}"
        for name in (
            "enorm.weight",
            "hnorm.weight",
            "eh_proj.weight",
            "shared_head.norm.weight",
            "shared_head.head.weight",
            "embed_tokens.weight",
            "self_attn.kv_b_proj.weight",
            "mlp.experts.0.gate_proj.weight",
            "mlp.gate.e_score_correction_bias",
        )
    } <= set(shapes)
    assert shapes[f"{MTP}eh_proj.weight"] == [64, 128] and all(k.startswith(MTP) for k in shapes)
    weight_map = json.loads((demo_dir / "model.safetensors.index.json").read_text())["weight_map"]
    assert weight_map[f"{MTP}eh_proj.weight"] == demo_mtp_dsv3.MTP_SHARD
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "deepseek_v3" and config["num_nextn_predict_layers"] == 1


def test_the_cli_builds_the_same_float32_files_and_a_second_resolve_reuses_the_build(
    demo_dir, demo_cache_dir, tmp_path, capsys
):
    assert main(["demo", "build", str(tmp_path / "again"), "--size", "mtp-dsv3"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again")
    names = ("model.safetensors", demo_mtp_dsv3.MTP_SHARD, "model.safetensors.index.json", "config.json", DEMO_MARKER)
    for name in names:
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (demo_dir, tmp_path / "again")]
        assert digest[0] == digest[1], name
    assert json.loads((demo_dir / DEMO_MARKER).read_text())["dtype"] == "float32"
    marker_time = (demo_dir / DEMO_MARKER).stat().st_mtime_ns
    assert resolve_demo_model("demo:mtp-dsv3", demo_cache_dir) == demo_dir
    assert (demo_dir / DEMO_MARKER).stat().st_mtime_ns == marker_time  # cached, not rebuilt


def test_the_layout_table_picks_the_loader_by_model_type():
    qwen = mtp_layout_loader({"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}})
    assert mtp_layout_loader({"model_type": "deepseek_v3"}) is load_deepseek_mtp
    assert mtp_layout_loader({"model_type": "kimi_k2"}) is load_deepseek_mtp  # mlx-lm remaps it to deepseek_v3
    assert qwen is not load_deepseek_mtp and mtp_layout_loader({"model_type": "qwen3_next"}) is qwen


def test_the_loaded_layer_holds_the_constructed_weights_through_mlx_lms_sanitize(demo_dir, target):
    """kv_b_proj split back into MLA's embed_q / unembed_out, per-expert matrices stacked: the build's weights."""
    config = json.loads((demo_dir / "config.json").read_text())
    expected = demo_mtp_dsv3.constructed_weights(config, 0, [])  # no damped rows: they touch only lm_head
    drafter = MTPDrafter.for_target(target[0], demo_dir, hidden_state_mode=None)
    loaded = dict(tree_flatten(drafter.head.layer.parameters()))
    assert "self_attn.embed_q.weight" in loaded and "mlp.switch_mlp.gate_proj.weight" in loaded
    assert "embed_tokens.weight" not in loaded and "shared_head.head.weight" not in loaded  # shared with the target
    for name, value in loaded.items():
        np.testing.assert_array_equal(np.array(value), expected[MTP + name], err_msg=name)


def test_only_the_shards_the_index_names_for_the_layer_are_read(demo_dir, target, monkeypatch):
    read = []
    real = mx.load
    monkeypatch.setattr(mx, "load", lambda path, *a, **kw: read.append(path) or real(path, *a, **kw))
    MTPDrafter.for_target(target[0], demo_dir, hidden_state_mode=None)
    assert [p.rsplit("/", 1)[-1] for p in read] == [demo_mtp_dsv3.MTP_SHARD]


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_with_the_deepseek_head_equals_plain_greedy_and_drafts_are_accepted(demo_dir, target, k):
    model, tokenizer = target
    drafter = MTPDrafter.for_target(model, demo_dir, hidden_state_mode=None)
    assert isinstance(drafter.head, DeepseekMTPHead) and drafter.hidden_state_mode == "post_norm"
    proposed = accepted = 0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        got, p, a = speculative_greedy(model, drafter, ids, NEW_TOKENS, k)
        assert got == plain_greedy(model, ids, NEW_TOKENS), prompt
        proposed, accepted = proposed + p, accepted + a
    assert accepted / proposed > 0.5  # constructed agreement (measured ~0.77 at k=1, ~0.64 at k=3)


def test_the_embedding_and_head_are_shared_unless_the_checkpoint_differs(demo_dir, target, tmp_path):
    model, tokenizer = target
    shared = MTPDrafter.for_target(model, demo_dir, hidden_state_mode=None)
    assert shared._embed is model.model.embed_tokens
    own_dir = _copy(demo_dir, tmp_path / "own-head")
    tensors = mx.load(str(own_dir / demo_mtp_dsv3.MTP_SHARD))
    flipped = -tensors[f"{MTP}shared_head.head.weight"]  # a head that ranks every token backwards
    mx.save_safetensors(str(own_dir / demo_mtp_dsv3.MTP_SHARD), {**tensors, f"{MTP}shared_head.head.weight": flipped})
    own = MTPDrafter.for_target(model, own_dir, hidden_state_mode=None)
    assert mx.array_equal(own.head.layer.shared_head.head.weight, flipped).item()
    ids = tokenizer.encode(PROMPTS[0])
    got, proposed, accepted = speculative_greedy(model, own, ids, 16, 3)
    assert got == plain_greedy(model, ids, 16) and accepted < proposed / 4  # its own (bad) head drafted


def test_a_checkpoint_without_its_mtp_layer_is_refused(demo_dir, target, tmp_path):
    missing = _copy(demo_dir, tmp_path / "no-mtp")
    (missing / demo_mtp_dsv3.MTP_SHARD).unlink()
    index = json.loads((missing / "model.safetensors.index.json").read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not k.startswith(MTP)}
    (missing / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match=r"no model\.layers\.2\.\* weights"):
        MTPDrafter.for_target(target[0], missing, hidden_state_mode=None)
    config = json.loads((demo_dir / "config.json").read_text())
    with pytest.raises(ModelLoadError, match="num_nextn_predict_layers"):
        load_deepseek_mtp(demo_dir, {**config, "num_nextn_predict_layers": 0}, (None, None))


def test_the_hidden_state_mode_comes_from_the_config_or_the_model(demo_dir, target, tmp_path):
    model = target[0]
    assert MTPDrafter.for_target(model, demo_dir, hidden_state_mode="pre_norm").hidden_state_mode == "pre_norm"
    pre_dir = _copy(demo_dir, tmp_path / "pre")
    config = json.loads((pre_dir / "config.json").read_text())
    (pre_dir / "config.json").write_text(json.dumps({**config, "mtp_hidden_state_mode": "pre_norm"}))
    assert MTPDrafter.for_target(model, pre_dir, hidden_state_mode=None).hidden_state_mode == "pre_norm"
    assert MTPDrafter.for_target(model, pre_dir, hidden_state_mode="post_norm").hidden_state_mode == "post_norm"


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst
