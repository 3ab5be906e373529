"""The real server on the real demo model (MLX on the CPU), driven by the openai client."""

from __future__ import annotations

import threading

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server
from vllm_mlx_trio.testing.polling import engine_idle, wait_until

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
CHAT = [{"role": "user", "content": "What is 2+2?"}]
TIMEOUT_S = 120


async def test_streamed_text_equals_non_streamed_text(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            whole = await c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=40, temperature=0)
            stream = await c.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert whole.choices[0].message.content == streamed
    assert streamed and "\ufffd" not in streamed
    assert whole.usage.completion_tokens == chunks[-1].usage.completion_tokens
    assert whole.choices[0].finish_reason in ("stop", "length")


async def test_max_tokens_gives_length(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            reply = await c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3, temperature=0)
    assert reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"


async def test_stop_string_is_trimmed(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            full = await c.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=30, temperature=0)
            text = full.choices[0].text
            stop = text[len(text) // 2 :][:3]
            assume_stop = stop.strip() != ""
            cut = await c.completions.create(
                model=MODEL, prompt="Once upon a time", max_tokens=30, temperature=0, stop=[stop]
            )
    assert assume_stop, f"greedy text too short to pick a stop string: {text!r}"
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


async def test_seeded_sampling_is_reproducible(demo_cfg):
    params = {"model": MODEL, "messages": CHAT, "max_tokens": 20, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            first = await c.chat.completions.create(**params)
            second = await c.chat.completions.create(**params)
            other = await c.chat.completions.create(**{**params, "seed": 8})
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content


async def test_disconnect_mid_stream_leaves_no_state(demo_cfg):
    body = {"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 1000, "temperature": 0}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with httpx.AsyncClient() as http:
                async with http.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as resp:
                    lines = resp.aiter_lines()
                    for _ in range(6):
                        await lines.__anext__()
            await wait_until(srv.engine.statistics, until=engine_idle, poll_s=0.05)
            stats = srv.engine.statistics()
            async with openai_client(srv.url) as c:  # and the engine still serves
                after = await c.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5)
    assert stats.scheduler.num_aborted == 1 and stats.cache.num_leased == 0
    assert after.usage.completion_tokens == 5


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_every_mlx_call_runs_on_the_executor_thread(demo_cfg, monkeypatch, mode):
    from vllm_mlx_trio.worker import simple_runner
    from vllm_mlx_trio.worker.batched import runner as batch_runner

    runner = simple_runner.SimpleRunner if mode == "simple" else batch_runner.BatchRunner
    threads = set()
    original_load, original_execute = runner.load, runner.execute

    def recording_load(self):
        threads.add(threading.current_thread().name)
        return original_load(self)

    def recording_execute(self, plan):
        threads.add(threading.current_thread().name)
        return original_execute(self, plan)

    monkeypatch.setattr(runner, "load", recording_load)
    monkeypatch.setattr(runner, "execute", recording_execute)
    cfg = attrs.evolve(demo_cfg, engine=attrs.evolve(demo_cfg.engine, mode=mode))
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(_drain, engine)
    assert threads == {"mlx-executor"}


async def _drain(engine):
    async for _ in engine.generate(CHAT, SamplingParams(max_tokens=5)):
        pass
