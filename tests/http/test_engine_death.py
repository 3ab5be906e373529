"""Engine death: in-flight requests fail with the cause (in-band on streams), new requests
get 503, /health says failed, and the engine's block raises the cause."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.errors import EngineClosedError, ExecutorCrashedError
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_fake_engine, open_server

CHAT = [{"role": "user", "content": "hello"}]


async def test_engine_death_fails_requests_and_refuses_new_ones(autojump_clock):
    seen = {}
    with trio.fail_after(10):
        with pytest.raises(ExecutorCrashedError, match="injected failure at step 3"):
            async with open_fake_engine(fail_at_step=3) as fake:
                with pytest.raises(ExecutorCrashedError, match="injected failure"):
                    async for _delta in fake.engine.generate(CHAT, SamplingParams(max_tokens=50)):
                        pass
                seen["health"] = fake.engine.health.ok
                with pytest.raises(EngineClosedError, match="has failed"):
                    await fake.engine.submit(CHAT)
                seen["stats"] = fake.engine.statistics()
    assert seen["health"] is False
    assert seen["stats"].num_requests == 0 and seen["stats"].scheduler.running_ids == ()


async def test_engine_death_over_http(fake_cfg):
    lines: list[str] = []
    with trio.fail_after(20):
        with pytest.raises(ExecutorCrashedError):
            factory = fake_executor_factory(fail_at_step=5, step_s=0.01)
            async with open_server(fake_cfg, executor_factory=factory) as srv:
                async with httpx.AsyncClient(timeout=10) as client:
                    body = {"model": "demo:tiny", "messages": CHAT, "max_tokens": 50, "stream": True}
                    async with client.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as r:
                        lines = [line async for line in r.aiter_lines() if line]
                    health = await client.get(f"{srv.url}/health")
                    refused = await client.post(f"{srv.url}/v1/chat/completions", json={**body, "stream": False})
    error = json.loads(lines[-1].removeprefix("data: "))["error"]
    assert error["code"] == "engine_failed" and "injected failure" in error["message"]
    assert "data: [DONE]" not in lines
    assert health.status_code == 503 and health.json()["status"] == "failed"
    assert refused.status_code == 503
    assert refused.json()["error"]["type"] == "service_unavailable"


async def test_a_stalled_step_trips_the_watchdog(autojump_clock):
    from vllm_mlx_trio.errors import EngineStalledError
    from vllm_mlx_trio.testing.fake_executor import StepGate

    gate = StepGate()  # never opened: the first step never returns
    with trio.fail_after(100):
        with pytest.raises(EngineStalledError, match="longer than 5.0 s"):
            async with open_fake_engine(overrides=("limits.engine_stall_timeout_s=5",), gate=gate, step_s=0) as fake:
                start = trio.current_time()
                with pytest.raises(EngineStalledError):
                    async for _delta in fake.engine.generate(CHAT):
                        pass
                waited = trio.current_time() - start
                healthy = fake.engine.health.ok
    assert 5 <= waited < 6 and not healthy
