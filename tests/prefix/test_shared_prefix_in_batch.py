"""Rows of the running batch that share a cached prefix hold it once (worker/cascade/), on the architecture zoo
(tests/prefix/prefix_zoo.py): greedy and seeded outputs are the same with sharing on and off, token for token,
while rows join and finish mid-group, a row's prefix diverges from the batch's, and a row shares nothing. With
sharing on, rows did share on every model whose attention takes it (plain KV layers, and the full-attention
layers of sliding-window and hybrid models); MLA and attention sinks serve unshared, saying why."""

from __future__ import annotations

import pytest
import trio
from prefix_zoo import ARCHITECTURES

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.actors.executor import keeping_runners
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.batched.runner import BatchRunner

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
SYSTEM = (
    "You are a careful assistant for a harbour town. You answer questions about boats, tides, the weather "
    "over the bay and the old lighthouse, briefly and in plain words, and you never invent a timetable. "
)
OTHER = "You are a poet of the northern roads. Answer in two short lines about the road and the sky. "
UNSHARED = {"deepseek_v3": "attention does not take a shared prefix", "gpt_oss": "do not call"}


def config(model_dir: str, share: bool, *overrides: str):
    return load_config(
        None,
        overrides=[
            f"model.path={model_dir}",
            "engine.mode=batched",
            "cache.block_size=16",
            "cache.state_snapshot_blocks=1",  # hybrid models: a hit at every block of the system prompt
            f"cache.share_prefix_in_batch={'true' if share else 'false'}",
            "cache.share_prefix_min_tokens=16",  # the tiny prompts' one-block prefixes share
            *overrides,
        ],
        environ={},
    )


def capture(cfg, runners: list):
    return keeping_runners(lambda request_waiting: BatchRunner(cfg, request_waiting=request_waiting), runners)


def jobs() -> list[tuple[str, SamplingParams]]:
    """Most share SYSTEM, two share OTHER (a diverging group), one shares nothing; lengths differ, so rows finish
    mid-group while others still arrive; every third samples with a seed."""

    def params(i: int, max_tokens: int) -> SamplingParams:
        if i % 3 == 2:
            return SamplingParams(temperature=0.9, seed=100 + i, max_tokens=max_tokens, ignore_eos=True)
        return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)

    shared = [f"{SYSTEM}Question {i}: what about the tide at hour {i * 3 + 1}?" for i in range(6)]
    prompts = [*shared[:3], f"{OTHER}Road 1.", *shared[3:], "A lone prompt about nothing in particular.", OTHER]
    return [(prompt, params(i, 5 + 4 * (i % 3))) for i, prompt in enumerate(prompts)]


async def outputs(cfg, runners: list, saved: list[int]) -> list[list[int]]:
    """Every job's tokens; ``saved`` gets the most KV tokens the scheduler counted once that copies would hold."""
    results: dict[int, list[int]] = {}
    async with open_engine(cfg, executor_factory=capture(cfg, runners)) as engine:

        async def watch() -> None:
            while True:
                stats = engine.statistics().scheduler
                saved.append(stats.kv_tokens_unshared - stats.kv_tokens_held)
                await trio.sleep(0.002)

        async def one(i: int, prompt: str, params: SamplingParams) -> None:
            with await engine.submit(prompt, params) as stream:
                tokens: list[int] = []
                async for delta in stream:
                    tokens.extend(delta.token_ids)
            results[i] = tokens

        warm = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        await one(-2, f"{SYSTEM}Warm up.", warm)  # the system prompts' blocks are in the store
        await one(-1, f"{OTHER}Warm up.", warm)
        async with trio.open_nursery() as watching:
            watching.start_soon(watch)
            async with trio.open_nursery() as nursery:
                for i, (prompt, params) in enumerate(jobs()):
                    nursery.start_soon(one, i, prompt, params)
                    await trio.sleep(0.02 * (i % 3))  # arrivals spread over the running batch's steps
            watching.cancel_scope.cancel()
        saved.append(0)
        info = engine.model_info.shared_prefix_in_batch
        assert info == "on" or info.startswith("off")
    return [results[i] for i in sorted(results)]


@pytest.mark.parametrize("arch", ARCHITECTURES)
async def test_outputs_equal_with_sharing_on_and_off(arch, zoo_dirs):
    with trio.fail_after(TIMEOUT_S):
        saved_off: list[int] = []
        off = await outputs(config(zoo_dirs[arch], share=False), [], saved_off)
        runners: list = []
        saved_on: list[int] = []
        on = await outputs(config(zoo_dirs[arch], share=True), runners, saved_on)
    assert on == off
    assert max(saved_off) == 0
    sharing = runners[0]._sharing
    if arch in UNSHARED:
        assert not sharing.active and UNSHARED[arch] in sharing.status
        assert max(saved_on) == 0
    else:
        assert sharing.active and sharing.rows_shared >= 4, sharing.status
        assert max(saved_on) > 0  # the scheduler counted the shared prefix once


async def test_rows_prefilled_by_mlx_lm_share_too(zoo_dirs):
    """Without the runner's own prefill, mlx-lm's prompt batches merge, prefill and extend the shared rows."""
    overrides = ("engine.prefill_time_ratio=none",)
    with trio.fail_after(TIMEOUT_S):
        off = await outputs(config(zoo_dirs["qwen3"], False, *overrides), [], [])
        runners: list = []
        on = await outputs(config(zoo_dirs["qwen3"], True, *overrides), runners, [])
    assert on == off
    assert runners[0]._sharing.rows_shared >= 4
