"""``cache.warm_prompts_file``: its prompts are in the prefix cache when the engine is ready."""

from __future__ import annotations

import json

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.prefix.warm_prompts import read_warm_prompts
from vllm_mlx_trio.errors import ConfigError

TIMEOUT_S = 60
SYSTEM = [
    {"role": "system", "content": "You are the library's assistant. Answer briefly and kindly. " * 4},
    {"role": "user", "content": "Hello!"},
]
RAW = "Once upon a time, in a town by the sea, there lived an old sailor and his cat."


@pytest.mark.mlx
async def test_warm_prompts_are_cached_before_the_engine_is_ready(float32_dir, tmp_path):
    path = tmp_path / "warm.json"
    path.write_text(json.dumps([SYSTEM, RAW]))
    cfg = load_config(None, overrides=[f"model.path={float32_dir}", f"cache.warm_prompts_file={path}"], environ={})
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            stats = engine.statistics().cache
            assert stats.num_queries == 2 and stats.pool.num_blocks > 0  # before any request
            for prompt in (SYSTEM, RAW):
                with await engine.submit(prompt, params) as stream:
                    async for _ in stream:
                        pass
                assert stream.usage.cached_tokens == stream.usage.prompt_tokens - 1


def test_a_bad_warm_prompts_file_is_a_config_error(tmp_path):
    bad = tmp_path / "bad.json"
    for content in ("{not json", json.dumps({"prompt": "x"}), json.dumps([1, 2]), json.dumps([[{"x": 1}]])):
        bad.write_text(content)
        with pytest.raises(ConfigError, match="warm_prompts_file"):
            read_warm_prompts(str(bad))
    with pytest.raises(ConfigError, match="warm_prompts_file"):
        read_warm_prompts(str(tmp_path / "missing.json"))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(["hi", SYSTEM]))
    assert read_warm_prompts(str(good)) == ["hi", SYSTEM]
