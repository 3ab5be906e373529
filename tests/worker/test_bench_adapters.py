"""``bench adapters`` on the tiny demo model: every setting measured (the base, one adapter, and
the base mixed with both demo adapters in one batch). Nothing here asserts on measured speed."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio.bench.adapters import measure_adapters, with_adapters
from vllm_mlx_trio.errors import ConfigError

pytestmark = pytest.mark.mlx


async def test_bench_adapters_measures_every_setting(demo_cfg):
    assert with_adapters(demo_cfg).model.adapters == (("a", "demo:tiny-lora"), ("b", "demo:tiny-lora-b"))
    with trio.fail_after(180):
        rows = await measure_adapters(demo_cfg, runs=1, rows=3, max_tokens=4)
    assert [r["setting"] for r in rows] == ["base", "adapter a", "mixed"]
    assert rows[0]["ratio"] == "1.000" and all(float(r["ratio"]) > 0 for r in rows)


def test_a_model_without_demo_adapters_needs_them_configured(demo_cfg):
    with pytest.raises(ConfigError, match="model.adapters"):
        with_adapters(attrs.evolve(demo_cfg, model=attrs.evolve(demo_cfg.model, path="demo:vlm-tiny")))
