"""Hypercorn connections that write straight to the socket (http/direct_send.py): no checkpoint
when the socket takes a piece at once; Hypercorn's own path, in order, for the rest."""

from __future__ import annotations

import json
import socket

import attrs
import hypercorn.trio.run as hypercorn_run
import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.events import Closed, RawData
from hypercorn.trio.tcp_server import TCPServer

from vllm_mlx_trio.http.direct_send import DirectSendConnection, use_direct_send
from vllm_mlx_trio.testing.clients import exchange, post
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server


class HandledEvents:
    """Stands in for Hypercorn's protocol: records what the connection hands it."""

    def __init__(self):
        self.events = []

    async def handle(self, event):
        self.events.append(event)


def connection(stream) -> DirectSendConnection:
    conn = DirectSendConnection(None, Config(), None, None, stream)
    conn.protocol = HandledEvents()
    return conn


async def socket_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    left, right = trio.socket.socketpair()
    return trio.SocketStream(left), trio.SocketStream(right)


async def receive_exactly(stream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await stream.receive_some(size - len(data))
    return data


async def test_a_piece_the_socket_takes_is_written_without_a_checkpoint():
    with trio.fail_after(10):
        ours, peer = await socket_pair()
        conn = connection(ours)
        with trio.testing.assert_no_checkpoints():
            await conn.protocol_send(RawData(data=b"data: one\n\n"))
            await conn.protocol_send(RawData(data=b"data: two\n\n"))
        assert await receive_exactly(peer, 22) == b"data: one\n\ndata: two\n\n"


async def test_a_held_lock_sends_the_piece_hypercorns_way_after_the_holder():
    with trio.fail_after(10):
        ours, peer = await socket_pair()
        conn = connection(ours)
        release = trio.Event()

        async def hold_the_lock():
            async with conn.send_lock:
                await release.wait()
                await ours.send_all(b"first ")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_the_lock)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(conn.protocol_send, RawData(data=b"second"))
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        assert await receive_exactly(peer, 12) == b"first second"


async def test_what_a_full_socket_does_not_take_follows_in_order():
    payload = bytes(range(256)) * 16384  # 4 MiB, far past any socket buffer
    with trio.fail_after(30):
        ours, peer = await socket_pair()
        ours.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        conn = connection(ours)
        received = []

        async def read_all():
            received.append(await receive_exactly(peer, len(payload) + 3))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await conn.protocol_send(RawData(data=payload))
            await conn.protocol_send(RawData(data=b"end"))
        assert received == [payload + b"end"]


async def test_a_connection_that_is_not_a_plain_socket_goes_hypercorns_way():
    with trio.fail_after(10):
        send_stream, receive_stream = trio.testing.memory_stream_one_way_pair()
        conn = connection(send_stream)
        with trio.testing.assert_checkpoints():
            await conn.protocol_send(RawData(data=b"over TLS, say"))
        assert await receive_stream.receive_some() == b"over TLS, say"


async def test_a_broken_connection_is_closed_as_hypercorn_closes_it():
    with trio.fail_after(10):
        ours, peer = await socket_pair()
        await peer.aclose()
        conn = connection(ours)
        for _ in range(3):  # the first write may still land in the kernel's buffer
            await conn.protocol_send(RawData(data=b"x" * 65536))
        assert any(isinstance(event, Closed) for event in conn.protocol.events)


@pytest.fixture
def hypercorn_connection_class():
    """Hypercorn's connection class as it was before the test."""
    before = hypercorn_run.TCPServer
    yield
    hypercorn_run.TCPServer = before


@pytest.mark.parametrize("direct", [True, False])
async def test_the_option_picks_hypercorns_connection_class_and_streams_alike(
    fake_cfg, hypercorn_connection_class, direct
):
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, direct_socket_writes=direct))
    body = {"model": fake_cfg.model_name, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with trio.fail_after(20):
        async with open_server(cfg, executor_factory=fake_executor_factory(step_s=0)) as srv:
            assert hypercorn_run.TCPServer is (DirectSendConnection if direct else TCPServer)
            streamed = await exchange(srv.url, post("/v1/chat/completions", json.dumps(body).encode()))
    assert streamed.startswith(b"HTTP/1.1 200") and streamed.count(b'"content"') >= 2
    assert streamed.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")  # the last event, then the chunked body's end


def test_use_direct_send_switches_the_class_both_ways(hypercorn_connection_class):
    use_direct_send(True)
    assert hypercorn_run.TCPServer is DirectSendConnection
    use_direct_send(False)
    assert hypercorn_run.TCPServer is TCPServer
