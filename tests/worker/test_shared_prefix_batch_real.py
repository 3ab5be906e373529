"""Rows of the running batch that share a cached prefix hold it once (worker/cascade/): greedy outputs are the
same with sharing on and off, token for token, while rows join and finish mid-group, a row's prefix diverges, and
a row shares nothing; with sharing on, rows did share."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.actors.executor import ExecutorActor
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.batched.runner import BatchRunner

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
SYSTEM = (
    "You are a careful assistant for a harbour town. You answer questions about boats, tides, the weather "
    "over the bay and the old lighthouse, briefly and in plain words, and you never invent a timetable. "
)
OTHER = "You are a poet of the northern roads. Answer in two short lines about the road and the sky. "


def config(model_dir: str, share: bool, *overrides: str):
    return load_config(
        None,
        overrides=[
            f"model.path={model_dir}",
            "engine.mode=batched",
            "cache.block_size=16",
            f"cache.share_prefix_in_batch={'true' if share else 'false'}",
            *overrides,
        ],
        environ={},
    )


def capture(cfg, runners: list):
    def make(request_waiting):
        runner = BatchRunner(cfg, request_waiting=request_waiting)
        runners.append(runner)
        return runner

    return lambda plan_recv, result_send: ExecutorActor(
        plan_recv=plan_recv, result_send=result_send, runner_factory=make
    )


def jobs() -> list[tuple[str, int]]:
    """(prompt, max_tokens): most share SYSTEM, two share OTHER (a diverging group), one shares nothing;
    different lengths, so rows finish mid-group while others still arrive."""
    shared = [(f"{SYSTEM}Question {i}: what about the tide at hour {i * 3 + 1}?", 6 + 5 * (i % 3)) for i in range(6)]
    other = [(f"{OTHER}Road {i}.", 9) for i in range(2)]
    return [*shared[:3], other[0], *shared[3:], ("A lone prompt about nothing in particular.", 7), other[1]]


async def outputs(cfg, runners: list | None = None) -> list[list[int]]:
    factory = capture(cfg, runners) if runners is not None else None
    results: dict[int, list[int]] = {}
    async with open_engine(cfg, executor_factory=factory) as engine:

        async def one(i: int, prompt: str, max_tokens: int) -> None:
            params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
            with await engine.submit(prompt, params) as stream:
                tokens: list[int] = []
                async for delta in stream:
                    tokens.extend(delta.token_ids)
            results[i] = tokens

        await one(-1, f"{SYSTEM}Warm up.", 2)  # the system prompt's blocks are in the store
        await one(-2, f"{OTHER}Warm up.", 2)
        async with trio.open_nursery() as nursery:
            for i, (prompt, max_tokens) in enumerate(jobs()):
                nursery.start_soon(one, i, prompt, max_tokens)
                await trio.sleep(0.05 * (i % 3))  # arrivals spread over the running batch's steps
    return [results[i] for i in sorted(results)]


async def test_greedy_outputs_equal_with_sharing_on_and_off(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        off = await outputs(config(float32_dir, share=False))
        runners: list = []
        on = await outputs(config(float32_dir, share=True), runners)
    assert on == off
    (runner,) = runners
    assert runner._sharing.active
    assert runner._sharing.rows_shared >= 4
