"""A saturated engine (every slot taken, steps held) still answers its control endpoints at
once, and refuses more work with an immediate 429 that takes no engine slot."""

from __future__ import annotations

import functools

import attrs
import httpx
import trio

from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server
from vllm_mlx_trio.testing.polling import wait_until

CHAT = [{"role": "user", "content": "hello"}]


async def test_control_endpoints_answer_while_saturated(fake_cfg):
    cfg = attrs.evolve(
        fake_cfg,
        engine=attrs.evolve(fake_cfg.engine, max_num_seqs=2),
        limits=attrs.evolve(fake_cfg.limits, max_waiting=2),
        server=attrs.evolve(fake_cfg.server, drain_timeout_s=0.5),
    )
    gate = StepGate()  # no step completes while the test looks
    factory = fake_executor_factory(gate=gate, step_s=0)
    body = {"model": "demo:tiny", "messages": CHAT, "max_tokens": 5}
    with trio.fail_after(20):
        async with open_server(cfg, executor_factory=factory) as srv:
            async with httpx.AsyncClient(timeout=5) as client, trio.open_nursery() as nursery:
                for _ in range(4):  # 2 running + 2 waiting: the engine is full
                    nursery.start_soon(functools.partial(client.post, f"{srv.url}/v1/chat/completions", json=body))
                await wait_until(lambda: srv.engine.statistics().num_requests >= 4, poll_s=0.01)
                replies = {path: await client.get(f"{srv.url}{path}") for path in ("/health", "/metrics", "/v1/models")}
                refused = await client.post(f"{srv.url}/v1/chat/completions", json=body)
                stats = srv.engine.statistics()
                gate.allow(1000)
    assert {path: r.status_code for path, r in replies.items()} == dict.fromkeys(replies, 200)
    assert refused.status_code == 429 and refused.headers["retry-after"]
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert stats.num_requests == 4  # the refused one never took a slot
