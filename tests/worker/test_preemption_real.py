"""Preemption on the real demo model: with a KV budget too small for the whole batch, the
newest requests are dropped and recomputed from prompt + output, and every request still
produces exactly what it produces with room to spare (greedy and seeded alike); a request of
a higher priority preempts a full batch, with the same exactness."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.requests import chat

pytestmark = pytest.mark.mlx

TIMEOUT_S = 240
GREEDY = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
SEEDED = SamplingParams(
    temperature=0.9, top_p=0.95, seed=11, max_tokens=300, ignore_eos=True, presence_penalty=0.3, min_tokens=5
)


def config(model_dir: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "Number {}, please."


async def run_batch(engine) -> dict[int, list[int]]:
    outputs: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        params = SEEDED if i % 2 else GREEDY
        outputs[i] = [t async for d in engine.generate(chat(QUESTION.format(i)), params) for t in d.token_ids]

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    return outputs


async def test_preempted_requests_finish_with_the_tokens_they_would_have_had(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir)) as engine:
            roomy = await run_batch(engine)
            assert engine.statistics().scheduler.num_preemptions == 0
        # float32 tiny: 512 bytes per token, so 1 MiB holds 2048 tokens, and 8 rows of
        # ~320 tokens need 2560.
        async with open_engine(config(float32_dir, "engine.kv_memory_mb=1")) as engine:
            assert engine.model_info.kv_budget_tokens == 2048
            tight = await run_batch(engine)
            stats = engine.statistics()
    assert stats.scheduler.num_preemptions > 0
    assert stats.num_requests == 0 and stats.cache.num_leased == 0
    assert all(len(tokens) == 300 for tokens in tight.values())
    assert tight == roomy


async def test_a_higher_priority_preempts_the_full_batch_and_both_outputs_are_exact(float32_dir):
    low = attrs.evolve(SEEDED, max_tokens=80, priority=5)  # sampled: its PRNG resumes where it stopped
    high = attrs.evolve(GREEDY, max_tokens=20, priority=0)
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, "engine.max_num_seqs=1")) as engine:
            alone = {
                name: [t async for d in engine.generate(chat(name), params) for t in d.token_ids]
                for name, params in (("low", low), ("high", high))
            }
            order: list[str] = []
            together: dict[str, list[int]] = {}

            async def run(name: str, stream) -> None:
                with stream:
                    together[name] = [t async for d in stream for t in d.token_ids]
                order.append(name)

            async with trio.open_nursery() as nursery:
                low_stream = await engine.submit(chat("low"), low)
                first = await low_stream.__anext__()  # low is running and has streamed
                nursery.start_soon(run, "high", await engine.submit(chat("high"), high))
                rest = [t async for d in low_stream for t in d.token_ids]
                together["low"] = [*first.token_ids, *rest]
                order.append("low")
            stats = engine.statistics()
    assert stats.scheduler.num_preemptions == 1
    assert order == ["high", "low"]
    assert together == alone
