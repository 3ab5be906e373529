"""A request's engine streams end by structured means only: their owner closes them (the HTTP
request's ASGI call at the latest), never the garbage collector."""

from __future__ import annotations

import gc
import json

import trio
import trio.testing

from vllm_mlx_trio.http.app import create_app
from vllm_mlx_trio.http.auth import ApiKeys
from vllm_mlx_trio.messages import RequestId
from vllm_mlx_trio.stream import RequestStream
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer, StepGate
from vllm_mlx_trio.testing.harness import open_fake_engine


def test_a_stream_dropped_unclosed_is_left_alone_by_the_garbage_collector():
    """Closing touches Trio state (the channel, the metrics' clock): a collection, which may run
    on any thread and outside Trio, must not do it."""
    closes: list[bool] = []

    async def open_one():
        send, recv = trio.open_memory_channel(4)
        return RequestStream(RequestId("r"), recv, FakeTokenizer(), (), on_close=closes.append), send

    stream, send = trio.run(open_one)
    del stream
    gc.collect()
    assert closes == []
    assert send.statistics().open_receive_channels == 1  # still open: nobody closed it


async def test_streams_of_a_response_never_started_are_closed_when_its_asgi_call_ends(fake_cfg, autojump_clock):
    """The client leaves after the handler returned its streaming response, before Quart entered
    the body (which would have closed the stream): the request's ASGI call closes it."""
    gate = StepGate()
    body = json.dumps({"model": "demo:tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    scope = {
        "type": "http",
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    received = [{"type": "http.request", "body": body.encode(), "more_body": False}]
    started = trio.Event()

    async def receive() -> dict:
        if received:
            return received.pop()
        await trio.sleep_forever()  # the connection stays up until the client gives up

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            started.set()
            await trio.sleep_forever()  # the client never reads the response

    with trio.fail_after(10):
        async with open_fake_engine(cfg=fake_cfg, gate=gate) as fake:
            app = create_app(fake.engine, fake_cfg, api_keys=ApiKeys())
            async with trio.open_nursery() as nursery:
                nursery.start_soon(app, scope, receive, send)
                await started.wait()
                inside = fake.engine.num_requests
                nursery.cancel_scope.cancel()  # the client leaves
            after = fake.engine.num_requests
            gate.allow(100)
    assert (inside, after) == (1, 0)
