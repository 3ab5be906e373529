"""A named adapter's prefix-cache hit whose spilled block is unreadable is recomputed with the
adapter, not the base: the adapter's greedy output is unchanged."""

from __future__ import annotations

import attrs
import pytest
import trio
from test_disk_tier_engine import OTHER, PARAMS, PROMPT, config, files, run

from vllm_mlx_trio import open_engine
from vllm_mlx_trio.testing.polling import wait_until

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
ADAPTER = attrs.evolve(PARAMS, adapter="a")


def with_adapter(model_dir: str, demo_cache_dir: str, disk_dir, *, enabled: bool = True):
    """The disk-tier test's batched config, serving ``demo:tiny-lora`` (the float32 demo's shapes) as "a"."""
    base = config(model_dir, disk_dir, enabled=enabled, mode="batched")
    model = attrs.evolve(base.model, demo_cache_dir=demo_cache_dir, adapters=(("a", "demo:tiny-lora"),))
    return attrs.evolve(base, model=model)


async def run_adapter(engine, prompt) -> list[int]:
    with await engine.submit(prompt, ADAPTER) as stream:
        tokens = [t async for delta in stream for t in delta.token_ids]
    await wait_until(lambda: engine.statistics().cache.num_leased == 0, poll_s=0.005)
    return tokens


async def test_a_hit_recomputed_after_a_bad_block_runs_the_adapter(float32_dir, demo_cache_dir, tmp_path):
    disk = tmp_path / "disk"
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(with_adapter(float32_dir, demo_cache_dir, None, enabled=False)) as engine:
            expected = await run_adapter(engine, PROMPT)
            base, _ = await run(engine, PROMPT)
        assert expected != base  # the adapter changes the reply
        async with open_engine(with_adapter(float32_dir, demo_cache_dir, disk)) as engine:
            await run_adapter(engine, PROMPT)
            await run_adapter(engine, OTHER)  # pushes PROMPT's deeper blocks out to disk
            assert engine.statistics().cache.pool.num_on_disk > 0
            for path in files(disk):  # the spilled blocks unreadable: the hit is recomputed from the first
                data = path.read_bytes()
                path.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))
            tokens = await run_adapter(engine, PROMPT)
    assert tokens == expected
