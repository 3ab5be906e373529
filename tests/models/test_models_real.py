"""``[[models]]`` on the real demo models: measured footprints, eviction under a budget that
holds one of them, and a bad path answered while the others serve."""

from __future__ import annotations

import functools

import httpx
import openai
import pytest
import trio

from vllm_mlx_trio.config import config_from_dict
from vllm_mlx_trio.models.serve import serve_models
from vllm_mlx_trio.testing.clients import openai_client

pytestmark = pytest.mark.mlx

CHAT = [{"role": "user", "content": "hi"}]


def budget_for_one_cfg(demo_cache_dir: str):
    """tiny: ~0.2 MiB of weights + 40 MiB of KV + 4 MiB of cache; small: ~64 + 8 + 4 MiB."""
    return config_from_dict(
        {
            "server": {"port": 0, "drain_timeout_s": 5, "model_memory_mb": 100},
            "model": {"demo_cache_dir": demo_cache_dir},
            "engine": {"kv_memory_mb": 8},
            "cache": {"memory_mb": 4},
            "models": [
                {"name": "tiny", "path": "demo:tiny", "engine": {"kv_memory_mb": 40}},
                {"name": "small", "path": "demo:small"},
                {"name": "broken", "path": "/nonexistent/model"},
            ],
        }
    )


async def test_two_demo_models_take_turns_in_a_budget_for_one(demo_cache_dir):
    stop = trio.Event()
    with trio.fail_after(240):
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                functools.partial(serve_models, budget_for_one_cfg(demo_cache_dir), shutdown_trigger=stop.wait)
            )
            url = binds[0]
            async with openai_client(url) as client, httpx.AsyncClient() as http:
                first = await client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)
                await client.chat.completions.create(model="small", messages=CHAT, max_tokens=4, temperature=0)
                after_small = (await http.get(f"{url}/v1/status")).json()
                with pytest.raises(openai.APIStatusError) as broken:
                    await client.chat.completions.create(model="broken", messages=CHAT, max_tokens=4)
                again = await client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)
                cards = (await http.get(f"{url}/v1/models")).json()["data"]
            stop.set()
    models = {model["name"]: model for model in after_small["models"]}
    assert models["tiny"]["state"] == "not_loaded" and models["small"]["state"] == "loaded"
    assert 44 <= models["tiny"]["memory_mb"] <= 46 and 75 <= models["small"]["memory_mb"] <= 77
    assert after_small["memory"] == {"budget_mb": 100, "loaded_mb": models["small"]["memory_mb"]}
    assert models["small"]["engine"]["model"]["name"] == "small"
    assert broken.value.status_code == 503 and "'broken' could not be loaded" in broken.value.body["message"]
    assert again.choices[0].message.content == first.choices[0].message.content  # reloaded, same greedy reply
    assert {card["id"]: card["state"] for card in cards} == {
        "tiny": "loaded",
        "small": "not_loaded",
        "broken": "failed",
    }
