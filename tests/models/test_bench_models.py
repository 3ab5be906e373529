"""``bench models``: its configurations and rows, and its TTFT read from a real stream."""

from __future__ import annotations

import httpx
import trio

from vllm_mlx_trio.bench.models import models_cfg, stream_chat, with_ratio
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.models import FakeModels, models_server
from vllm_mlx_trio.testing.models import models_cfg as fake_models_cfg


def test_the_paths_become_models_a_and_b_on_a_free_port_with_the_mode_and_budget():
    cfg = models_cfg(
        load_config(None, overrides=["engine.kv_memory_mb=64"], environ={}),
        ["demo:small", "demo:tiny"],
        memory_mb=170,
        steps="exclusive",
    )
    assert [(m.name, m.config.model.path) for m in cfg.models] == [("a", "demo:small"), ("b", "demo:tiny")]
    assert (cfg.server.port, cfg.server.model_memory_mb, cfg.server.model_steps) == (0, 170, "exclusive")
    assert cfg.models[0].config.engine.kv_memory_mb == 64


def test_rates_are_given_as_ratios_to_the_concurrent_row():
    rows = with_ratio(
        [{"model_steps": "concurrent", "agg_tok_s": 20.0}, {"model_steps": "exclusive", "agg_tok_s": 25.0}]
    )
    assert [row["vs_concurrent"] for row in rows] == [1.0, 1.25]


async def test_ttft_waits_for_the_first_content_not_the_role_chunk():
    with trio.fail_after(20):
        async with models_server(fake_models_cfg([{"name": "a", "path": "demo:tiny"}]), FakeModels()) as url:
            async with httpx.AsyncClient(base_url=url) as client:
                ttft, tokens = await stream_chat(client, "a", "hi", 5)
    assert ttft > 0 and tokens == 5
