"""The stream interval on the real demo model with run-ahead on: every token leaves as its step
ends (interval 1), or ``stream_interval`` at a time after the first, the rest with the finish,
alone and in a batch of four; a client that reads only at the end loses nothing."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.polling import wait_until
from vllm_mlx_trio.testing.requests import chat
from vllm_mlx_trio.worker.batched import runner as batch_runner

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
MAX_TOKENS = 23
#: Plans run ahead as far as the steps bound allows: no window ends them first.
RUN_AHEAD = (
    "engine.run_ahead_steps=8",
    "engine.run_ahead_ms=60000",
    "engine.solo_run_ahead_steps=16",
    "engine.solo_run_ahead_ms=60000",
)


def expected_chunks(interval: int, num_tokens: int = MAX_TOKENS) -> list[int]:
    """The first token alone, then ``interval`` at a time, and what is left with the finish."""
    rest = num_tokens - 1
    return [1] + [interval] * (rest // interval) + ([rest % interval] if rest % interval else [])


@pytest.fixture
def published(monkeypatch) -> list[str]:
    """The request ids of the steps handed over while their plan ran on (run-ahead happened)."""
    seen: list[str] = []
    publish = batch_runner.BatchRunner._publish

    def counted(runner, advance):
        seen.extend(e.request_id for e in advance.emissions)
        return publish(runner, advance)

    monkeypatch.setattr(batch_runner.BatchRunner, "_publish", counted)
    return seen


def engine_cfg(model_dir: str, interval: int):
    overrides = [f"model.path={model_dir}", f"engine.stream_interval={interval}", *RUN_AHEAD]
    return load_config(None, overrides=overrides, environ={})


def params(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, **kwargs)


async def chunk_sizes(model_dir: str, interval: int, num_streams: int) -> dict[int, list[int]]:
    """Tokens per delta of each of ``num_streams`` requests sent at once."""
    sizes: dict[int, list[int]] = {}

    async def one(engine, index: int) -> None:
        prompt = chat(f"Tell me about number {index} and the sea.")
        sizes[index] = [len(delta.token_ids) async for delta in engine.generate(prompt, params())]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(engine_cfg(model_dir, interval)) as engine, trio.open_nursery() as nursery:
            for index in range(num_streams):
                nursery.start_soon(one, engine, index)
    return sizes


@pytest.mark.parametrize("interval", [1, 2, 4, 10])
@pytest.mark.parametrize("num_streams", [1, 4])
async def test_each_chunk_holds_the_interval_while_plans_run_ahead(float32_dir, published, interval, num_streams):
    sizes = await chunk_sizes(float32_dir, interval, num_streams)
    assert sizes == {index: expected_chunks(interval) for index in range(num_streams)}
    assert len(published) >= num_streams * 4  # the plans did run several steps each


async def test_per_request_interval_overrides_the_engine(float32_dir, published):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(engine_cfg(float32_dir, 1)) as engine:
            deltas = [d async for d in engine.generate(chat("Hello there."), params(stream_interval=3))]
    assert [len(d.token_ids) for d in deltas] == expected_chunks(3)
    assert published


async def test_a_client_reading_only_at_the_end_loses_nothing(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(engine_cfg(float32_dir, 1)) as engine:
            prompt = chat("Tell me about the sea.")
            fast = [d async for d in engine.generate(prompt, params())]
            with await engine.submit(prompt, params()) as stream:
                await wait_until(lambda: engine.statistics().scheduler.num_finished == 2, poll_s=0.01)
                slow = [d async for d in stream]
    assert [t for d in slow for t in d.token_ids] == [t for d in fast for t in d.token_ids]
    assert "".join(d.text for d in slow) == "".join(d.text for d in fast)
    assert len(slow) < len(fast) == MAX_TOKENS  # coalesced into the outbox's few slots
    assert slow[-1].finish_reason == fast[-1].finish_reason == "length"


async def test_holding_run_ahead_tokens_sends_a_plan_at_once(float32_dir):
    cfg = engine_cfg(float32_dir, 1)
    held = load_config(None, overrides=[f"model.path={float32_dir}", *RUN_AHEAD, "engine.hold_run_ahead_tokens=true"])
    prompt = chat("Tell me about the sea.")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            each = [d async for d in engine.generate(prompt, params())]
        async with open_engine(held) as engine:
            whole = [d async for d in engine.generate(prompt, params())]
    assert [t for d in whole for t in d.token_ids] == [t for d in each for t in d.token_ids]
    assert len(each) == MAX_TOKENS
    assert len(whole[0].token_ids) == 1 and max(len(d.token_ids) for d in whole) > 1  # up to a plan's steps
