"""Clients that send too slowly or too much before the body: refused, the server unharmed."""

from __future__ import annotations

import attrs
import httpx
import trio

from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server


async def raw_exchange(url: str, request: bytes, *, pause_s: float = 0.0, tail: bytes = b"") -> bytes:
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(request)
        if pause_s:
            await trio.sleep(pause_s)
        if tail:
            try:
                await stream.send_all(tail)
            except trio.BrokenResourceError:
                pass  # the server already answered and closed
        reply = b""
        while chunk := await stream.receive_some():
            reply += chunk
            if b"\r\n\r\n" in reply and len(reply) > 200:
                break
        return reply


async def test_a_body_sent_too_slowly_gets_408_and_others_are_served(fake_cfg):
    cfg = attrs.evolve(fake_cfg, limits=attrs.evolve(fake_cfg.limits, body_timeout_s=0.5))
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"model": "demo:tiny",'
    )
    with trio.fail_after(20):
        async with open_server(cfg, executor_factory=fake_executor_factory()) as srv:
            reply = await raw_exchange(srv.url, head, pause_s=1.5)
            async with httpx.AsyncClient(timeout=5) as client:
                ok = await client.get(f"{srv.url}/health")
    assert reply.startswith(b"HTTP/1.1 408")
    assert b'"error"' in reply
    assert ok.status_code == 200


async def test_a_header_flood_is_refused(fake_cfg):
    flood = b"".join(b"X-Flood-%d: %s\r\n" % (i, b"a" * 1000) for i in range(200))
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n" + flood + b"\r\n"
    with trio.fail_after(20):
        async with open_server(fake_cfg, executor_factory=fake_executor_factory()) as srv:
            reply = await raw_exchange(srv.url, request)
            async with httpx.AsyncClient(timeout=5) as client:
                ok = await client.get(f"{srv.url}/health")
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1") else 0
    assert 400 <= status < 500, reply[:100]
    assert ok.status_code == 200
