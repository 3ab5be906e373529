"""Preemption on the architectures whose cache is not all KV: a preempted request is
recomputed from its prompt and output, through the prefix cache's checkpoints, to the very
tokens it would have had."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
PARAMS = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
ROW_TOKENS = 150  # a row's prompt and output, about
MAX_ROWS = 16


def config(model_dir: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model_dir}", "cache.block_size=16", *overrides], environ={})


async def run_batch(engine, rows: int) -> dict[int, list[int]]:
    outputs: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        prompt = [{"role": "user", "content": f"Number {i}, please: tell me about the sea and the sky."}]
        outputs[i] = [t async for d in engine.generate(prompt, PARAMS) for t in d.token_ids]

    async with trio.open_nursery() as nursery:
        for i in range(rows):
            nursery.start_soon(one, i)
    return outputs


@pytest.mark.parametrize("arch", ["gemma3_text", "gpt_oss", "qwen3_next", "lfm2"])
async def test_preempted_requests_finish_with_the_tokens_they_would_have_had(zoo_dirs, arch):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(zoo_dirs[arch], "engine.kv_memory_mb=1")) as engine:
            budget = engine.model_info.kv_budget_tokens
        rows = min(MAX_ROWS, -(-2 * budget // ROW_TOKENS))  # about twice what 1 MiB holds
        assert rows * ROW_TOKENS > budget
        async with open_engine(config(zoo_dirs[arch])) as engine:
            roomy = await run_batch(engine, rows)
        async with open_engine(config(zoo_dirs[arch], "engine.kv_memory_mb=1")) as engine:
            tight = await run_batch(engine, rows)
            stats = engine.statistics()
    assert stats.scheduler.num_preemptions > 0
    assert stats.num_requests == 0 and stats.cache.num_leased == 0
    assert tight == roomy
