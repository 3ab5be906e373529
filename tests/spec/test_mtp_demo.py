"""demo:mtp-tiny: a hybrid qwen3_5 target that mlx_lm.load reads, carrying a Qwen3.5-layout ``mtp.*`` head."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import mlx_lm
import pytest
from mlx_lm.models.cache import ArraysCache, KVCache

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.worker.demo import DEMO_MARKER, build_demo_model, resolve_demo_model
from vllm_mlx_trio.worker.speculative.mtp.head import safetensors_shapes

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def demo_dir(demo_cache_dir):
    return resolve_demo_model("demo:mtp-tiny", demo_cache_dir)


def test_mlx_lm_loads_the_hybrid_target_and_drops_the_mtp_head(demo_dir):
    model, tokenizer = mlx_lm.load(str(demo_dir))
    assert type(model).__module__ == "mlx_lm.models.qwen3_5"
    assert {type(c) for c in model.make_cache()} == {ArraysCache, KVCache}  # linear attention + attention
    assert not any("mtp" in name for name, _ in model.parameters().items())
    assert mlx_lm.generate(model, tokenizer, "Once upon a time", max_tokens=8)


def test_the_checkpoint_has_the_qwen3_5_layout(demo_dir):
    shapes = safetensors_shapes(demo_dir / "model.safetensors")
    mtp = {k for k in shapes if k.startswith("mtp.")}
    assert {
        "mtp.fc.weight",
        "mtp.pre_fc_norm_embedding.weight",
        "mtp.pre_fc_norm_hidden.weight",
        "mtp.norm.weight",
        "mtp.layers.0.self_attn.q_proj.weight",
        "mtp.layers.0.mlp.down_proj.weight",
    } <= mtp
    assert shapes["mtp.fc.weight"] == [64, 128]
    assert "model.language_model.embed_tokens.weight" in shapes and "lm_head.weight" in shapes
    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["text_config"]["mtp_num_hidden_layers"] == 1


def test_mlx_vlms_qwen3_5_mtp_drafter_accepts_the_head(demo_dir):
    """The head's tensors load strictly into mlx-vlm's own Qwen3.5 MTP drafter (a separate process: importing
    mlx_vlm has side effects)."""
    script = (
        "import json, sys, mlx.core as mx\n"
        "from mlx_vlm.speculative.drafters.qwen3_5_mtp import Model, ModelConfig\n"
        "d = sys.argv[1]\n"
        "m = Model(ModelConfig.from_dict(json.load(open(d + '/config.json'))))\n"
        "w = {k[4:]: v for k, v in mx.load(d + '/model.safetensors').items() if k.startswith('mtp.')}\n"
        "m.load_weights(list(w.items()), strict=True)\n"
        "print('loaded', len(w))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(demo_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("loaded 15")


def test_the_build_is_deterministic_and_the_cli_builds_it(demo_dir, tmp_path, capsys):
    assert main(["demo", "build", str(tmp_path / "again"), "--size", "mtp-tiny"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "again")
    for name in ("model.safetensors", "config.json", "tokenizer.json", DEMO_MARKER):
        digest = [hashlib.sha256((d / name).read_bytes()).hexdigest() for d in (demo_dir, tmp_path / "again")]
        assert digest[0] == digest[1], name
    other_seed = build_demo_model(tmp_path / "seed1", size="mtp-tiny", seed=1)
    assert (other_seed / "model.safetensors").read_bytes() != (demo_dir / "model.safetensors").read_bytes()
