"""The vlm extra: a text-only engine never imports mlx-vlm; a VLM config without it fails at
startup with one line naming the extra."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from vllm_mlx_trio.cli import main

TIMEOUT_S = 120
TEXT_ONLY = """
import sys, trio
from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config

async def main():
    cfg = load_config(None, overrides=["model.path=demo:tiny", "model.demo_cache_dir={cache}"], environ={{}})
    async with open_engine(cfg) as engine:
        async for _ in engine.generate("hello", SamplingParams(max_tokens=2)):
            pass
    assert "mlx_vlm" not in sys.modules, "a text-only engine imported mlx_vlm"
    print("ok")

trio.run(main)
"""


@pytest.mark.mlx
def test_a_text_only_engine_never_imports_mlx_vlm(demo_cache_dir):
    script = TEXT_ONLY.format(cache=demo_cache_dir)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_a_vlm_config_without_the_extra_fails_at_startup_naming_it(monkeypatch, demo_cache_dir, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlx_vlm" else real_find_spec(name, *a)
    )
    settings = ["model.path=demo:vlm-tiny", "engine.mode=vlm", f"model.demo_cache_dir={demo_cache_dir}"]
    settings.append("server.port=0")
    assert main(["serve", *(arg for setting in settings for arg in ("--set", setting))]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vlm extra" in err[0] and "vllm-mlx-trio[vlm]" in err[0], err


@pytest.mark.mlx
def test_demo_build_writes_the_vlm_as_a_checkpoint(tmp_path):
    import json

    out = tmp_path / "vlm"
    assert main(["demo", "build", str(out), "--size", "vlm-tiny"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl" and config["rope_scaling"]["type"] == "mrope"
    for name in ("preprocessor_config.json", "video_preprocessor_config.json", "tokenizer.json", "model.safetensors"):
        assert (out / name).is_file(), name
    template = json.loads((out / "tokenizer_config.json").read_text())["chat_template"]
    assert "<|vision_start|><|image_pad|><|vision_end|>" in template and "<|video_pad|>" in template
