"""engine.mode = "auto" (the default) routes a model by the towers its config.json declares;
a mode that does not fit the model is a startup error (vlm on a text model) or a documented
text-only fallback whose media 400 says why (a text runner on a vision-language model)."""

from __future__ import annotations

import json

import pytest
import trio
from vlm_helpers import MODEL, image_message, image_url

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server
from vllm_mlx_trio.worker.modality import declared_towers, read_model_config, text_only_note

TIMEOUT_S = 180


def test_declared_towers_read_config_json(tmp_path):
    assert declared_towers({"model_type": "qwen3"}) == ()
    assert declared_towers({"vision_config": {"depth": 1}}) == ("vision",)
    assert declared_towers({"vision_config": {}, "audio_config": {"d": 1}}) == ("audio",)
    assert text_only_note({"model_type": "qwen3"}) is None
    assert "gemma3 model declares a vision tower" in text_only_note({"model_type": "gemma3", "vision_config": {"a": 1}})
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "vision_config": {"a": 1}}))
    assert declared_towers(read_model_config(str(tmp_path))) == ("vision",)
    with pytest.raises(ModelLoadError, match="could not load model"):
        read_model_config(str(tmp_path / "missing"))


def cfg(demo_cache_dir, model: str, *overrides: str):
    return load_config(
        None,
        overrides=[f"model.path={model}", f"model.demo_cache_dir={demo_cache_dir}", "server.port=0", *overrides],
        environ={},
    )


@pytest.mark.mlx
@pytest.mark.parametrize(("model", "kind", "media"), [(MODEL, "vlm", True), ("demo:tiny", "batched", False)])
def test_auto_picks_the_runner_from_config_json(demo_cache_dir, model, kind, media):
    from vllm_mlx_trio.worker.auto_runner import AutoRunner
    from vllm_mlx_trio.worker.registry import runner_class

    runner = AutoRunner(cfg(demo_cache_dir, model))
    assert type(runner) is runner_class(kind)
    try:
        info = runner.load()
    finally:
        runner.close()
    assert info.runner_kind == kind
    assert bool(info.media_kinds) is media and info.text_only_note is None


@pytest.mark.mlx
def test_vlm_mode_on_a_text_model_fails_at_startup(demo_cache_dir):
    from vllm_mlx_trio.worker.vlm.runner import VlmRunner

    runner = VlmRunner(cfg(demo_cache_dir, "demo:tiny", "engine.mode=vlm"))
    with pytest.raises(ModelLoadError, match=r"'demo:tiny' is a text model \(model_type 'qwen3'"):
        runner.load()
    runner.close()


@pytest.mark.mlx
def test_unsupported_vlm_architecture_is_named_at_startup():
    from vllm_mlx_trio.worker.vlm.runner import check_served

    with pytest.raises(ModelLoadError, match="model_type 'florence2' is not served yet"):
        check_served("m", {"model_type": "florence2", "vision_config": {"a": 1}})
    bidirectional = {"use_bidirectional_attention": "vision"}
    with pytest.raises(ModelLoadError, match="gemma4 with text_config.use_bidirectional_attention = 'vision'"):
        check_served("m", {"model_type": "gemma4", "vision_config": {"a": 1}, "text_config": bidirectional})
    check_served("m", {"model_type": "gemma4", "vision_config": {"a": 1}, "text_config": {}})


@pytest.mark.mlx
async def test_text_mode_on_a_vlm_serves_text_and_says_why_media_are_refused(demo_cache_dir):
    config = cfg(demo_cache_dir, MODEL, "engine.mode=batched")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(config) as srv, openai_client(srv.url) as c:
            text = await c.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0
            )
            with pytest.raises(Exception) as refused:
                await c.chat.completions.create(
                    model=MODEL, messages=[image_message("Look:", image_url(1))], max_tokens=4
                )
    assert text.choices[0].message.content
    assert refused.value.status_code == 400
    message = refused.value.body["message"]
    assert "'image_url' is not supported by this model" in message and "served text-only" in message
    assert 'engine.mode = "auto"' in message
