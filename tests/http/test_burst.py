"""A burst of clients far beyond the engine's room: each one gets an HTTP answer (200 or 429),
and the engine holds nothing afterwards.

Every connection is opened (and its request sent) before the server accepts any: the test
connects them in one go without yielding to Trio, the way a burst from many processes outruns
one accept loop. They wait in the listener's queue, whose length is ``server.backlog``; with
Hypercorn's default (100) the connections past it are dropped or reset by the kernel.
"""

from __future__ import annotations

import json
import pathlib
import socket
import urllib.parse

import attrs
import pytest
import trio
import trio.testing

from vllm_mlx_trio.serve import hypercorn_config
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import fake_executor_factory, open_server

MAX_NUM_SEQS, MAX_WAITING = 4, 4
#: Clients in the burst: far beyond MAX_NUM_SEQS + MAX_WAITING, and beyond Hypercorn's default
#: backlog of 100 (so the test fails without server.backlog), but within the OS's somaxconn.
BURST = 250
#: A connection the listener's queue has no room for is not answered by the kernel: give up on it.
CONNECT_TIMEOUT_S = 1.0
#: Every third admitted client leaves mid-stream, once it has this many events (the role, then
#: tokens: tokens come only once the gate opens, after every refusal is in).
LEAVE_EVERY, LEAVE_AFTER_EVENTS = 3, 3
MAX_TOKENS = 40


def somaxconn() -> int:
    """The OS's cap on a listen backlog (Linux; elsewhere the compile-time default)."""
    path = pathlib.Path("/proc/sys/net/core/somaxconn")
    return int(path.read_text()) if path.exists() else socket.SOMAXCONN


def burst_cfg(fake_cfg):
    return attrs.evolve(
        fake_cfg,
        engine=attrs.evolve(fake_cfg.engine, max_num_seqs=MAX_NUM_SEQS),
        limits=attrs.evolve(fake_cfg.limits, max_waiting=MAX_WAITING),
    )


def request_bytes(model: str) -> bytes:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": MAX_TOKENS}
    ).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def connect_all(url: str, request: bytes, count: int) -> list[socket.socket]:
    """Open ``count`` connections and send ``request`` on each, without yielding to Trio; stops
    at the first connection the server's queue has no room for."""
    parts = urllib.parse.urlsplit(url)
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect((parts.hostname, parts.port))
            sock.sendall(request)
        except OSError:
            sock.close()
            break
        socks.append(sock)
    return socks


@attrs.define
class Answer:
    status: int | None = None
    done: bool = False  # the stream reached "data: [DONE]"


async def read_answer(sock: trio.socket.SocketType, leave_early: bool, answer: Answer, on_status) -> None:
    """Read the status line; for a 200, the stream to its last chunk (or leave mid-stream)."""
    received = b""
    with sock:
        while chunk := await sock.recv(65536):
            received += chunk
            if answer.status is None and b"\r\n" in received:
                answer.status = int(received.split(b" ", 2)[1])
                on_status(answer.status)
            if answer.status is not None and answer.status != 200:
                return  # the refusal is the answer
            if leave_early and received.count(b"data: {") >= LEAVE_AFTER_EVENTS:
                return  # mid-stream: the server sees the connection close
            if received.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
                answer.done = b"data: [DONE]" in received
                return


def test_the_listener_gets_the_configured_backlog(fake_cfg):
    assert hypercorn_config(fake_cfg).backlog == fake_cfg.server.backlog == 2048


async def test_a_burst_beyond_the_engine_gets_a_status_line_each(fake_cfg):
    if somaxconn() <= BURST:
        pytest.skip(f"the OS caps a listen backlog at {somaxconn()}, below the burst of {BURST}")
    cfg = burst_cfg(fake_cfg)
    gate = StepGate()  # no step runs until every refused client has its 429
    answers = [Answer() for _ in range(BURST)]
    refused_all = trio.Event()
    refused = []

    def on_status(status: int) -> None:
        if status == 429:
            refused.append(status)
            if len(refused) == BURST - MAX_NUM_SEQS - MAX_WAITING:
                refused_all.set()

    with trio.fail_after(30):
        async with open_server(cfg, executor_factory=fake_executor_factory(gate=gate, step_s=0)) as srv:
            socks = connect_all(srv.url, request_bytes(cfg.model_name), BURST)
            if len(socks) < BURST:
                for sock in socks:
                    sock.close()
                pytest.fail(f"only {len(socks)} of {BURST} connections were queued: the listen backlog is too small")
            async with trio.open_nursery() as nursery:
                for index, sock in enumerate(socks):
                    leave_early = index % LEAVE_EVERY == 0
                    nursery.start_soon(
                        read_answer, trio.socket.from_stdlib_socket(sock), leave_early, answers[index], on_status
                    )
                await refused_all.wait()
                gate.allow(10**6)
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)  # the departures reach the scheduler
            stats = srv.engine.statistics()
    statuses = [a.status for a in answers]
    assert statuses.count(429) == BURST - MAX_NUM_SEQS - MAX_WAITING
    assert statuses.count(200) == MAX_NUM_SEQS + MAX_WAITING, statuses
    stayed = [a for i, a in enumerate(answers) if a.status == 200 and i % LEAVE_EVERY]
    assert stayed and all(a.done for a in stayed)
    assert stats.num_requests == 0
    assert stats.scheduler.num_running == 0 and stats.scheduler.num_waiting == 0, stats.scheduler
