"""``cache.disk_dir`` end to end on the demo model: evicted blocks spill, a hit reads them back
(also after a restart), bad files are a miss, ``DELETE /v1/cache`` empties the directory."""

from __future__ import annotations

import logging

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.polling import wait_until
from vllm_mlx_trio.worker.prefix.disk_tier_file import FORMAT_VERSION

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
SYSTEM = {"role": "system", "content": "You answer in one short line about the sea and the stars. " * 5}
PROMPT = [SYSTEM, {"role": "user", "content": "What is the sea?"}]
OTHER = [
    {"role": "system", "content": "Talk only about mountains and rivers, briefly. " * 5},
    {"role": "user", "content": "Hi"},
]


def config(model_dir: str, disk_dir, *, enabled: bool = True, mode: str = "simple"):
    overrides = [
        f"model.path={model_dir}",
        f"engine.mode={mode}",
        "cache.block_size=16",
        f"cache.enabled={str(enabled).lower()}",
        # two entries in memory: every finished prompt's deeper blocks are evicted (spilled)
        "cache.memory_aware=false",
        "cache.max_entries=2",
        "cache.store_generated=false",
    ]
    overrides += [f"cache.disk_dir={disk_dir}"] if disk_dir is not None else []
    return load_config(None, overrides=overrides, environ={})


async def run(engine, prompt) -> tuple[list[int], int]:
    with await engine.submit(prompt, PARAMS) as stream:
        tokens = [t async for delta in stream for t in delta.token_ids]
    await wait_until(lambda: engine.statistics().cache.num_leased == 0, poll_s=0.005)
    return tokens, stream.usage.cached_tokens


def files(disk_dir) -> list:
    return sorted(disk_dir.glob("*.safetensors"))


async def cache_off(model_dir) -> list[int]:
    async with open_engine(config(model_dir, None, enabled=False)) as engine:
        return (await run(engine, PROMPT))[0]


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_spilled_blocks_are_read_back_and_survive_a_restart(float32_dir, tmp_path, mode):
    disk = tmp_path / "disk"
    with trio.fail_after(TIMEOUT_S):
        expected = await cache_off(float32_dir)
        async with open_engine(config(float32_dir, disk, mode=mode)) as engine:
            first = await run(engine, PROMPT)
            await run(engine, OTHER)  # pushes the rest of PROMPT's blocks out of memory
            assert engine.statistics().cache.pool.num_on_disk > 0
            again = await run(engine, PROMPT)
        assert first == (expected, 0)
        assert again[0] == expected and again[1] >= 48  # blocks came back from disk
        assert files(disk)
        async with open_engine(config(float32_dir, disk)) as restarted:  # a new engine, same dir
            assert restarted.statistics().cache.pool.num_on_disk > 0
            tokens, cached = await run(restarted, PROMPT)
            assert tokens == expected and cached >= 48
            await restarted.clear_prefix_cache()
            assert restarted.statistics().cache.pool.num_on_disk == 0
            await wait_until(lambda: not files(disk), poll_s=0.005)  # the runner empties the directory
            assert (await run(restarted, PROMPT)) == (expected, 0)  # both tiers were empty


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "foreign"])
async def test_a_bad_file_is_a_miss_logged_once_and_deleted(float32_dir, tmp_path, caplog, damage):
    disk = tmp_path / "disk"
    with trio.fail_after(TIMEOUT_S):
        expected = await cache_off(float32_dir)
        async with open_engine(config(float32_dir, disk)) as engine:
            await run(engine, PROMPT)
            await run(engine, OTHER)
        bad = files(disk)
        assert bad
        damaged = {}
        for path in bad:
            data = path.read_bytes()
            if damage == "truncate":
                path.write_bytes(data[: len(data) // 2])
            elif damage == "corrupt":
                path.write_bytes(data[:-8] + bytes(b ^ 0xFF for b in data[-8:]))
            else:
                path.write_bytes(data.replace(f'"format_version":"{FORMAT_VERSION}"'.encode(), b'"format_version":"0"'))
            damaged[path] = path.read_bytes()
        with caplog.at_level(logging.WARNING):
            async with open_engine(config(float32_dir, disk)) as restarted:
                tokens, cached = await run(restarted, PROMPT)
                tokens_again, _ = await run(restarted, PROMPT)
        assert tokens == expected == tokens_again  # never a wrong answer
        warned = [r.getMessage() for r in caplog.records if "not a usable block" in r.getMessage()]
        # nothing was reused: every block of the hit was on disk, and none could be read
        assert cached == 0
        if damage == "corrupt":  # found when a hit reads it: the hit is recomputed
            assert warned and len(warned) == len(set(warned))
        else:  # found when the tier opens: a miss
            assert len(warned) == len(bad)
        gone = [path for path in bad if any(path.name in w for w in warned)]
        assert all(not path.exists() or path.read_bytes() != damaged[path] for path in gone)  # deleted (or rewritten)
