"""A pure-recurrent model (mamba2: every layer an SSM state, no attention layer) with the
prefix cache on: served uncached, saying so once at startup, with exactly the cache-off greedy
output in both modes. Nothing in mlx-lm's ``ArraysCache`` tells how many tokens a state has
seen, so the store cannot tell where a checkpoint stands (see docs/architecture.md)."""

from __future__ import annotations

import logging
import pathlib

import pytest
import trio
from prefix_zoo import RECURRENT, build_model
from test_every_layer_type import chat, config, run, text

from vllm_mlx_trio import open_engine

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120


@pytest.fixture(scope="module")
def recurrent_dirs(tmp_path_factory, float32_dir) -> dict[str, str]:
    root = tmp_path_factory.mktemp("recurrent")
    return {arch: str(build_model(arch, root / arch, pathlib.Path(float32_dir))) for arch in RECURRENT}


async def scenario(engine) -> dict:
    tok = engine.model_info.tokenizer
    system = text(tok, 40, 0)
    out = {}
    for key, prompt in [
        ("first", chat(system, "What is the sea?")),
        ("repeat", chat(system, "What is the sea?")),
        ("shared_system", chat(system, "Why are the stars so far away from us?")),
    ]:
        out[key] = await run(engine, prompt)

    async def one(key, prompt):
        out[key] = await run(engine, prompt)

    async with trio.open_nursery() as nursery:  # inside a batch
        for i in range(3):
            nursery.start_soon(one, f"batch_{i}", chat(system, "What is the sea?"))
    return out


@pytest.mark.parametrize("mode", ["batched", "simple"])
@pytest.mark.parametrize("arch", sorted(RECURRENT))
async def test_a_pure_recurrent_model_is_served_uncached_and_exact(recurrent_dirs, arch, mode, caplog):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(recurrent_dirs[arch], mode, "cache.enabled=false")) as engine:
            off = await scenario(engine)
        with caplog.at_level(logging.WARNING):
            async with open_engine(config(recurrent_dirs[arch], mode)) as engine:
                on = await scenario(engine)
    for key in off:
        assert on[key].tokens == off[key].tokens, key
        assert on[key].logprobs == pytest.approx(off[key].logprobs, abs=1e-4), key
        assert on[key].cached_tokens == 0, key
    lines = [r.getMessage() for r in caplog.records if "prefix cache off for this model" in r.getMessage()]
    assert len(lines) == 1 and "no attention layer" in lines[0] and "serving uncached" in lines[0]
