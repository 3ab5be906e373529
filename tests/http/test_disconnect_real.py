"""Client disconnects on the real server and the real demo model (MLX on the CPU).

A client that leaves mid-prefill, mid-stream, during a non-streaming request or while its
request is still queued: the request leaves the batch within a few steps, its prefix-cache
blocks are released, the server counts the disconnect, a queued request never reaches the
model, and a greedy request running alongside produces exactly the text it produces alone.
Clients leave the ways real ones do: their task is cancelled (httpx closes the connection),
they close a streamed response early, or they close a raw socket.
"""

from __future__ import annotations

import importlib.resources
import json
import logging
import math
import urllib.parse

import attrs
import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.harness import open_server
from vllm_mlx_trio.testing.polling import wait_until

pytestmark = pytest.mark.mlx

TIMEOUT_S = 90
#: How long a departed request may take to leave the scheduler, and the engine to go idle.
LEAVE_S = 10.0
#: Steps a departure may take to reach the scheduler: the connection close, the handler's
#: cancellation, the plans already in flight. Far fewer than any scenario below has left.
MAX_STEPS_TO_LEAVE = 10
PREFILL_STEP = 16
MODEL = "demo-f32"
DISCONNECTED = "vllm:http_requests_client_disconnected_total"
WORDS = importlib.resources.files("vllm_mlx_trio").joinpath("data/corpus.txt").read_text().split()
#: The head of the long prompt, cached first so the long prompt leases blocks while it prefills.
WARM_PROMPT = " ".join(WORDS[:120])
LONG_PROMPT = " ".join(WORDS[:400])
OTHER_ID = "other-greedy"
VICTIM_ID = "victim"
OTHER_BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Count slowly from one to a hundred."}],
    "max_tokens": 90,
    "temperature": 0,
    "ignore_eos": True,
}


def server_cfg(model_dir: str, *overrides: str):
    return load_config(
        None,
        overrides=[
            "server.port=0",
            "server.drain_timeout_s=5",
            f"server.served_model_name={MODEL}",
            f"model.path={model_dir}",
            *overrides,
        ],
        environ={},
    )


def rid_header(request_id: str) -> dict[str, str]:
    return {"X-Request-Id": request_id}


# -- reading the server's state -------------------------------------------------------------


async def request_status(http: httpx.AsyncClient, url: str, request_id: str) -> dict | None:
    """The request's entry in ``/v1/status``, or None once the scheduler no longer holds it."""
    resp = await http.get(f"{url}/v1/status")
    assert resp.status_code == 200, resp.text
    return next((r for r in resp.json()["requests"] if r["id"] == request_id), None)


async def wait_phase(http: httpx.AsyncClient, url: str, request_id: str, phase: str) -> dict:
    """Poll ``/v1/status`` until the request is in ``phase``; its entry."""
    seen = []

    async def entry() -> dict | None:
        seen.append(await request_status(http, url, request_id))
        return seen[-1]

    with trio.move_on_after(LEAVE_S):
        return await wait_until(entry, until=lambda e: e is not None and e["phase"] == phase, poll_s=0.005)
    raise AssertionError(f"{request_id} never reached phase {phase!r}: last seen {seen[-1:]}")


async def disconnects(http: httpx.AsyncClient, url: str) -> float:
    resp = await http.get(f"{url}/metrics")
    assert resp.status_code == 200, resp.text
    values = [
        sample.value
        for family in text_string_to_metric_families(resp.text)
        for sample in family.samples
        if sample.name == DISCONNECTED
    ]
    assert values, f"{DISCONNECTED} missing from /metrics"
    return sum(values)  # over the endpoint label


def held(engine, request_id: str) -> bool:
    scheduler = engine.statistics().scheduler
    return request_id in scheduler.running_ids or request_id in scheduler.waiting_ids


def num_steps(engine) -> int:
    return engine.statistics().scheduler.num_steps


async def steps_until_gone(engine, request_id: str, steps_before: int) -> int:
    """Wait (bounded) until the scheduler drops the request; the steps run since ``steps_before``."""
    with trio.move_on_after(LEAVE_S):
        await wait_until(lambda: not held(engine, request_id), poll_s=0.001)
        return num_steps(engine) - steps_before
    raise AssertionError(f"{request_id} still held {LEAVE_S} s after its client left")


@attrs.frozen
class Before:
    """The counters a disconnect moves, read before it."""

    disconnects: float
    num_aborted: int
    num_queries: int

    @classmethod
    async def read(cls, http: httpx.AsyncClient, srv) -> Before:
        stats = srv.engine.statistics()
        return cls(await disconnects(http, srv.url), stats.scheduler.num_aborted, stats.cache.num_queries)


async def assert_released(http: httpx.AsyncClient, srv, before: Before):
    """Bounded: the engine goes idle with nothing leased; one abort, one counted disconnect."""
    engine = srv.engine
    with trio.move_on_after(LEAVE_S):
        await wait_until(engine.statistics, until=lambda s: not s.num_requests and not s.cache.num_leased, poll_s=0.01)
    stats = engine.statistics()
    assert stats.num_requests == 0, stats
    assert stats.scheduler.num_running == 0 and stats.scheduler.num_waiting == 0, stats.scheduler
    assert stats.cache.num_leased == 0 and stats.cache.pool.num_in_use == 0, stats.cache
    assert stats.cache.pool.num_shared == 0, stats.cache.pool
    assert stats.scheduler.num_aborted == before.num_aborted + 1, stats.scheduler
    with trio.move_on_after(LEAVE_S):  # counted as the handler unwinds
        await wait_until(lambda: disconnects(http, srv.url), until=lambda n: n >= before.disconnects + 1, poll_s=0.01)
    assert await disconnects(http, srv.url) == before.disconnects + 1
    return stats


def assert_no_errors(caplog) -> None:
    """Nothing on the server logged an error (an unhandled exception, a 5xx)."""
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


# -- clients ---------------------------------------------------------------------------------


async def greedy_text(http: httpx.AsyncClient, url: str, body: dict = OTHER_BODY, request_id: str = OTHER_ID) -> str:
    resp = await http.post(f"{url}/v1/chat/completions", json=body, headers=rid_header(request_id))
    assert resp.status_code == 200, resp.text
    reply = resp.json()
    assert reply["usage"]["completion_tokens"] == body["max_tokens"], reply  # it ran to the end
    return reply["choices"][0]["message"]["content"]


async def start_other(
    nursery: trio.Nursery,
    http: httpx.AsyncClient,
    url: str,
    body: dict = OTHER_BODY,
    request_id: str = OTHER_ID,
) -> dict:
    """Run a greedy request in the background until it decodes; its text lands in the dict."""
    out: dict = {}

    async def run() -> None:
        out["text"] = await greedy_text(http, url, body, request_id)

    nursery.start_soon(run)
    await wait_phase(http, url, request_id, "decode")
    return out


async def start_cancellable(nursery: trio.Nursery, fn, *args) -> trio.CancelScope:
    """Run ``fn(*args)`` in its own cancel scope; cancelling it is the client giving up."""

    async def run(task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            await fn(*args)

    return await nursery.start(run)


async def victim_stream(url: str, path: str, body: dict, outcome: dict) -> None:
    """A streaming client on its own connection, reading until it is cancelled."""
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", f"{url}{path}", json=body, headers=rid_header(VICTIM_ID)) as resp:
            outcome["status"] = resp.status_code
            async for _line in resp.aiter_lines():
                pass
    outcome["finished"] = True  # not reached when the client really gave up


async def victim_post(url: str, path: str, body: dict, outcome: dict) -> None:
    """A non-streaming client on its own connection, waiting for its answer."""
    async with httpx.AsyncClient(timeout=60) as http:
        resp = await http.post(f"{url}{path}", json=body, headers=rid_header(VICTIM_ID))
    outcome["finished"] = resp.status_code


async def raw_streaming_chat(url: str, body: dict, request_id: str) -> trio.SocketStream:
    """Send a streaming chat request on a raw socket; return once the SSE body has begun."""
    parts = urllib.parse.urlsplit(url)
    sock = await trio.open_tcp_stream(parts.hostname, parts.port)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        f"X-Request-Id: {request_id}\r\n\r\n"
    )
    await sock.send_all(head.encode() + payload)
    received = b""
    while b"data: " not in received:  # the role chunk: the server has accepted the request
        chunk = await sock.receive_some(4096)
        assert chunk, f"the server closed the connection: {received!r}"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200"), received
    return sock


# -- 1: mid-prefill --------------------------------------------------------------------------


async def test_disconnect_mid_prefill(float32_dir, caplog):
    """Prefill spans ~45 steps of 16 tokens; the client leaves a few steps in."""
    cfg = server_cfg(float32_dir, "engine.mode=batched", f"engine.prefill_step_size={PREFILL_STEP}")
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(timeout=60) as http:
            quiet = await greedy_text(http, srv.url)
            warm = {"model": MODEL, "prompt": WARM_PROMPT, "max_tokens": 1}
            assert (await http.post(f"{srv.url}/v1/completions", json=warm)).status_code == 200
            before, outcome = await Before.read(http, srv), {}
            async with trio.open_nursery() as nursery:
                other = await start_other(nursery, http, srv.url)
                client = await start_cancellable(nursery, victim_stream, srv.url, "/v1/completions", body, outcome)
                entry = await wait_phase(http, srv.url, VICTIM_ID, "prefill")
                leased_blocks = srv.engine.statistics().cache.pool.num_in_use
                steps_before = num_steps(srv.engine)
                client.cancel()  # the client gives up: httpx closes its connection
                steps = await steps_until_gone(srv.engine, VICTIM_ID, steps_before)
                other_still_running = held(srv.engine, OTHER_ID)
            await assert_released(http, srv, before)
    assert_no_errors(caplog)
    prefill_steps = math.ceil((entry["prompt_tokens"] - entry["cached_tokens"]) / PREFILL_STEP)
    assert entry["cached_tokens"] > 0 and leased_blocks > 0  # it held blocks while prefilling
    assert prefill_steps >= 4 * MAX_STEPS_TO_LEAVE, entry
    assert steps <= MAX_STEPS_TO_LEAVE, (steps, prefill_steps)  # its prefill never finished
    assert outcome == {"status": 200}
    assert other_still_running and other["text"] == quiet


# -- 2: mid-stream ---------------------------------------------------------------------------


def victim_chat(*, stream: bool) -> dict:
    content = "Tell me a very long story about the sea."
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        "max_tokens": 1000,
        "temperature": 0,
        "ignore_eos": True,
    }


async def read_data_lines(resp: httpx.Response, count: int) -> list[str]:
    lines = []
    async for line in resp.aiter_lines():
        if line.startswith("data: "):
            lines.append(line)
            if len(lines) == count:
                return lines
    raise AssertionError(f"the stream ended after {lines}")


async def test_disconnect_mid_stream(float32_dir, caplog):
    """The client reads a few chunks of a long stream, then closes the response."""
    cfg = server_cfg(float32_dir, "engine.mode=batched")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(timeout=60) as http:
            quiet = await greedy_text(http, srv.url)
            before = await Before.read(http, srv)
            async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as own:
                other = await start_other(nursery, http, srv.url)
                path, body = f"{srv.url}/v1/chat/completions", victim_chat(stream=True)
                async with own.stream("POST", path, json=body, headers=rid_header(VICTIM_ID)) as resp:
                    assert resp.status_code == 200
                    chunks = await read_data_lines(resp, 5)
                    entry = await request_status(http, srv.url, VICTIM_ID)
                    steps_before = num_steps(srv.engine)
                # leaving the block closed the response early: httpx drops the connection
                steps = await steps_until_gone(srv.engine, VICTIM_ID, steps_before)
                other_still_running = held(srv.engine, OTHER_ID)
            await assert_released(http, srv, before)
    assert_no_errors(caplog)
    assert entry is not None and entry["phase"] == "decode", entry
    assert all(chunk != "data: [DONE]" for chunk in chunks)
    assert steps <= MAX_STEPS_TO_LEAVE, steps
    assert other_still_running and other["text"] == quiet


# -- 3: a non-streaming request ----------------------------------------------------------------


async def test_disconnect_during_non_streaming_request(float32_dir, caplog):
    """A non-streaming client gives up while its request decodes."""
    cfg = server_cfg(float32_dir, "engine.mode=batched")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(timeout=60) as http:
            quiet = await greedy_text(http, srv.url)
            before, outcome = await Before.read(http, srv), {}
            async with trio.open_nursery() as nursery:
                other = await start_other(nursery, http, srv.url)
                body = victim_chat(stream=False)
                client = await start_cancellable(nursery, victim_post, srv.url, "/v1/chat/completions", body, outcome)
                entry = await wait_phase(http, srv.url, VICTIM_ID, "decode")
                steps_before = num_steps(srv.engine)
                client.cancel()  # the client gives up: httpx closes its connection
                steps = await steps_until_gone(srv.engine, VICTIM_ID, steps_before)
                other_still_running = held(srv.engine, OTHER_ID)
            stats = await assert_released(http, srv, before)
    assert_no_errors(caplog)
    assert outcome == {}  # the client never got an answer
    assert entry["output_tokens"] < 1000 and steps <= MAX_STEPS_TO_LEAVE, (entry, steps)
    assert stats.scheduler.num_finished == 2  # the quiet and the concurrent greedy runs
    assert other_still_running and other["text"] == quiet


# -- 4: while queued ---------------------------------------------------------------------------


async def watch_phases(engine, seen: dict[str, set[str]], task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Record every phase each request is seen in, until cancelled."""
    task_status.started()
    while True:
        for snapshot in engine.statistics().scheduler.requests:
            seen.setdefault(snapshot.request_id, set()).add(snapshot.phase)
        await trio.sleep(0.001)


FIRST_ID = "first"
FIRST_BODY = {**OTHER_BODY, "max_tokens": 120}


@pytest.mark.parametrize("mode", ["batched", "simple"])
async def test_disconnect_while_queued_never_reaches_the_model(float32_dir, mode, caplog):
    """One sequence at a time: the second request waits, and its client closes the socket."""
    cfg = server_cfg(float32_dir, f"engine.mode={mode}", "engine.max_num_seqs=1")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(timeout=60) as http:
            alone = await greedy_text(http, srv.url, FIRST_BODY, FIRST_ID)
            before, seen = await Before.read(http, srv), {}
            async with trio.open_nursery() as nursery:
                first = await start_other(nursery, http, srv.url, FIRST_BODY, FIRST_ID)
                async with trio.open_nursery() as watching:
                    await watching.start(watch_phases, srv.engine, seen)
                    sock = await raw_streaming_chat(srv.url, victim_chat(stream=True), VICTIM_ID)
                    entry = await wait_phase(http, srv.url, VICTIM_ID, "queued")
                    steps_before = num_steps(srv.engine)
                    await sock.aclose()  # the client closes its socket
                    steps = await steps_until_gone(srv.engine, VICTIM_ID, steps_before)
                    first_still_running = FIRST_ID in srv.engine.statistics().scheduler.running_ids
                    watching.cancel_scope.cancel()
            stats = await assert_released(http, srv, before)
    assert_no_errors(caplog)
    assert entry["output_tokens"] == 0 and steps <= MAX_STEPS_TO_LEAVE, (entry, steps)
    assert first_still_running  # it left while the only batch slot was still taken
    assert seen[VICTIM_ID] == {"queued"}, seen  # never prefill or decode
    assert stats.cache.num_queries == before.num_queries + 1  # only the first one looked up
    assert first["text"] == alone
