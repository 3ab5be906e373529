"""The benches' lean streaming client against raw HTTP/1.1 servers: every framing a peer uses,
refusals, and connections kept (or found closed) between requests."""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import AsyncIterator

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx_trio.bench.http import BenchClient, BenchError, HttpTarget, open_bench_client, traced_request
from vllm_mlx_trio.bench.latency.run import Lane, _one_level
from vllm_mlx_trio.bench.sse_client import ChunkedDecoder, SseConnections, StreamProtocolError, parse_head

CONTENT = {"choices": [{"delta": {"content": "x"}}]}
USAGE = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunked(payload: bytes, size: int) -> bytes:
    pieces = [payload[i : i + size] for i in range(0, len(payload), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nX-Trailer: 1\r\n\r\n"


async def read_request(stream: trio.SocketStream, buffer: bytearray) -> dict | None:
    """One request's JSON body off ``stream`` (None: the client closed)."""
    while b"\r\n\r\n" not in buffer:
        data = await stream.receive_some(65536)
        if not data:
            return None
        buffer += data
    end = buffer.index(b"\r\n\r\n")
    head = bytes(buffer[:end]).decode()
    length = int(next(line.split(":")[1] for line in head.split("\r\n") if line.lower().startswith("content-length")))
    while len(buffer) < end + 4 + length:
        buffer += await stream.receive_some(65536)
    body = json.loads(bytes(buffer[end + 4 : end + 4 + length]))
    del buffer[: end + 4 + length]
    return body


class RawServer:
    """Answers each request with ``respond(body)``'s wire pieces (sent one at a time); counts
    connections; ``close_after`` requests, it closes the connection."""

    def __init__(self, respond, close_after: int | None = None):
        self.respond, self.close_after, self.connections = respond, close_after, 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buffer, served = bytearray(), 0
        async with stream:
            while (body := await read_request(stream, buffer)) is not None:
                for piece in self.respond(body):
                    await stream.send_all(piece)
                    await trio.lowlevel.checkpoint()
                served += 1
                if served == self.close_after:
                    return

    async def start(self, nursery: trio.Nursery) -> str:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, self.handle, 0, host="127.0.0.1"))
        return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


@contextlib.asynccontextmanager
async def serving(*servers: RawServer, timeout_s: float = 10) -> AsyncIterator[tuple[list[HttpTarget], BenchClient]]:
    """The servers listening, a target for each, and the benches' client; all closed after."""
    async with trio.open_nursery() as nursery:
        try:
            targets = [HttpTarget(base_url=await server.start(nursery), model="m") for server in servers]
            async with open_bench_client(timeout_s=timeout_s, max_connections=4) as client:
                yield targets, client
        finally:
            nursery.cancel_scope.cancel()


def split(data: bytes, at: int) -> list[bytes]:
    return [data[i : i + at] for i in range(0, len(data), at)]


FRAMINGS = {
    "chunked": lambda payload: [
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        *split(chunked(payload, 37), 11),
    ],
    "content-length": lambda payload: [
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(payload),
        *split(payload, 5),
    ],
}


@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_each_framing_gives_every_chunk_and_keeps_the_connection(framing):
    server = RawServer(lambda body: FRAMINGS[framing](sse(CONTENT, CONTENT, USAGE)))
    with trio.fail_after(10):
        async with serving(server) as ([target], client):
            traces = [await traced_request(client, target, "hi", 8) for _ in range(3)]
    assert [t.completion_tokens for t in traces] == [2, 2, 2] and [len(t.arrivals) for t in traces] == [2, 2, 2]
    assert target.count_sources == {"usage"} and server.connections == 1


async def test_a_body_ended_by_the_close_and_a_connection_closed_while_kept():
    """``mlx_lm.server``'s way: no length, the connection's end ends the body; then a server
    that closes a kept connection: the next request goes on a new one."""
    close_delimited = RawServer(lambda body: [b"HTTP/1.0 200 OK\r\n\r\n", sse(CONTENT)], close_after=1)
    closes_kept = RawServer(
        lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(sse(CONTENT)), sse(CONTENT)],
        close_after=1,
    )
    with trio.fail_after(10):
        async with serving(close_delimited, closes_kept) as (targets, client):
            traces = [await traced_request(client, t, "hi", 8) for t in targets for _ in range(2)]
    assert [t.completion_tokens for t in traces] == [1, 1, 1, 1]
    assert [t.count_sources for t in targets] == [{"chunks"}, {"chunks"}]  # no usage chunk: tokens are chunks
    assert close_delimited.connections == closes_kept.connections == 2


async def test_refusals_and_error_chunks_and_broken_bodies_raise_bench_errors():
    def respond(body: dict) -> list[bytes]:
        if body["max_tokens"] == 1:
            error = json.dumps({"error": {"message": "too long"}}).encode()
            return [b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(error), error)]
        if body["max_tokens"] == 2:
            return [b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", sse({"error": {"message": "boom"}})]
        return [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"zz\r\n"]

    server = RawServer(respond)
    with trio.fail_after(10):
        async with serving(server) as ([target], client):
            with pytest.raises(BenchError, match="answered 400: .*too long"):
                await traced_request(client, target, "hi", 1)
            with pytest.raises(BenchError, match="failed mid-stream.*boom"):
                await traced_request(client, target, "hi", 2)
            with pytest.raises(BenchError, match="bad chunk size"):
                await traced_request(client, target, "hi", 3)


async def test_a_silent_server_times_out_instead_of_hanging():
    server = RawServer(lambda body: [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"])
    with trio.fail_after(10):
        async with serving(server, timeout_s=0.2) as ([target], client):
            with pytest.raises(BenchError, match="sent nothing for 0.2 s"):
                await traced_request(client, target, "hi", 8)


@given(
    payload=st.binary(max_size=300),
    chunk_size=st.integers(1, 50),
    feed_size=st.integers(1, 40),
)
def test_chunked_decoding_does_not_depend_on_how_the_bytes_arrive(payload, chunk_size, feed_size):
    decoder, out = ChunkedDecoder(), bytearray()
    for piece in split(chunked(payload, chunk_size), feed_size):
        assert not decoder.done
        out += decoder.feed(piece)
    assert decoder.done and bytes(out) == payload


def test_heads_and_addresses_that_are_not_http_are_refused():
    head = parse_head(b"HTTP/1.1 200 OK\r\nConnection: Close\r\nX-A: b: c")
    assert head.status == 200 and head.headers["x-a"] == "b: c" and not head.keep_alive
    assert parse_head(b"HTTP/1.1 200 OK").keep_alive and not parse_head(b"HTTP/1.0 200 OK").keep_alive
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive").keep_alive
    with pytest.raises(StreamProtocolError, match="status line"):
        parse_head(b"SSH-2.0-OpenSSH\r\n")
    with pytest.raises(StreamProtocolError, match="not an http"):
        SseConnections("ftp://host/")


async def test_a_latency_row_counts_what_the_client_spent_per_token():
    server = RawServer(lambda body: FRAMINGS["chunked"](sse(CONTENT, CONTENT, USAGE)))
    with trio.fail_after(10):
        async with serving(server) as ([target], client):
            row = await _one_level(Lane(label="peer", target=target), ["a", "b", "c"], 2, 8, client)
    assert row["reqs"] == 3 and row["chunks_per_token"] == 1.0
    assert row["client_cpu_ms_per_token"] > 0 and row["cpu_ms_per_token"] is None  # no server pid to read
