"""A response to a request that said ``Connection: close`` ends with the server closing the
connection, for a plain answer, a stream and a 413 whose body was never read (see
http/close_connection.py: without it Hypercorn's close is cancelled under Quart-Trio)."""

from __future__ import annotations

import json

import attrs
import trio

from vllm_mlx_trio.testing.clients import exchange, post
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server


async def test_the_server_closes_after_a_plain_answer_and_a_stream(fake_cfg):
    with trio.fail_after(20):
        async with open_server(fake_cfg, executor_factory=fake_executor_factory(step_s=0)) as srv:
            health = await exchange(srv.url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            body = json.dumps(
                {
                    "model": fake_cfg.model_name,
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                    "max_tokens": 5,
                }
            ).encode()
            streamed = await exchange(srv.url, post("/v1/chat/completions", body))
    assert health.startswith(b"HTTP/1.1 200") and health.endswith(b'{"status":"ok"}\n')
    assert streamed.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in streamed


async def test_the_server_closes_after_refusing_a_body_too_large(fake_cfg):
    cfg = attrs.evolve(fake_cfg, limits=attrs.evolve(fake_cfg.limits, max_body_bytes=1024))
    with trio.fail_after(20):
        async with open_server(cfg, executor_factory=fake_executor_factory(step_s=0)) as srv:
            refused = await exchange(srv.url, post("/v1/chat/completions", b"{" + b" " * 5000 + b"}"))
    assert refused.startswith(b"HTTP/1.1 413")
