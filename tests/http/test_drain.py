"""Shutdown drain: a stream still running at the drain deadline ends with an in-band error
(not a cut connection); one that finishes in time ends normally with [DONE]."""

from __future__ import annotations

import json

import attrs
import httpx
import trio
import trio.testing

from vllm_mlx_trio.serve import _drain_first
from vllm_mlx_trio.testing.fake_executor import StepGate, text_script
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_fake_engine, open_server

CHAT = [{"role": "user", "content": "hello"}]


async def stream_lines(url: str, max_tokens: int, lines: list[str], started: trio.Event) -> None:
    body = {"model": "demo:tiny", "messages": CHAT, "max_tokens": max_tokens, "stream": True}
    async with httpx.AsyncClient(timeout=10) as client:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                    started.set()


async def test_drain_deadline_sends_an_in_band_error_to_unfinished_streams(fake_cfg):
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, drain_timeout_s=1.0))
    factory = fake_executor_factory(script=text_script("abc", then_eos=False), step_s=0.01)
    long_lines: list[str] = []
    short_lines: list[str] = []
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with open_server(cfg, executor_factory=factory) as srv:
                long_started, short_started = trio.Event(), trio.Event()
                nursery.start_soon(stream_lines, srv.url, 100_000 // 50, long_lines, long_started)
                nursery.start_soon(stream_lines, srv.url, 20, short_lines, short_started)
                await long_started.wait()
                await short_started.wait()
            # leaving the block started the drain (1 s) and waited for it
    last = json.loads(long_lines[-1].removeprefix("data: "))
    assert last["error"]["code"] == "engine_unavailable"
    assert "shutting down" in last["error"]["message"]
    assert short_lines[-1] == "data: [DONE]"


async def test_while_draining_new_requests_get_503_and_health_says_draining(fake_cfg):
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, drain_timeout_s=3.0))
    factory = fake_executor_factory(script=text_script("abc", then_eos=False), step_s=0.01)
    lines: list[str] = []
    seen = {}
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            async with open_server(cfg, executor_factory=factory) as srv:
                started = trio.Event()
                nursery.start_soon(stream_lines, srv.url, 60, lines, started)
                await started.wait()
                url = srv.url

                async def probe_during_drain() -> None:
                    # Leaving the block below sets the shutdown trigger, and nothing waits
                    # between that and the drain's start: once every task waits, it has begun.
                    await trio.testing.wait_all_tasks_blocked()
                    seen["draining"] = srv.engine.draining
                    async with httpx.AsyncClient(timeout=5) as client:
                        seen["health"] = await client.get(f"{url}/health")
                        body = {"model": "demo:tiny", "messages": CHAT, "max_tokens": 5}
                        seen["new"] = await client.post(f"{url}/v1/chat/completions", json=body)

                nursery.start_soon(probe_during_drain)
    assert seen["draining"]
    assert seen["health"].status_code == 503 and seen["health"].json() == {"status": "draining"}
    assert seen["new"].status_code == 503
    assert lines[-1] == "data: [DONE]"  # the stream inside finished normally


async def test_the_drain_ends_the_instant_the_last_request_leaves(autojump_clock):
    """No polling: the drain is woken by the last stream's close, at that very instant."""
    gate = StepGate()
    closed_at: list[float] = []
    with trio.fail_after(30):
        async with open_fake_engine(overrides=("server.drain_timeout_s=60",), gate=gate) as fake:
            stream = await fake.engine.submit(CHAT)

            async def leave_later() -> None:
                await trio.sleep(5.003)
                stream.close()
                closed_at.append(trio.current_time())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(leave_later)
                await _drain_first(fake.engine, trio.lowlevel.checkpoint)()
                drained_at = trio.current_time()
            draining = fake.engine.draining
            gate.allow(100)
    assert draining and drained_at == closed_at[0]
