"""The reliability promises at process level: the real CLI in a subprocess, real signals.

SIGTERM drains (new requests 503, in-flight streams finish, exit 0); the drain deadline
ends unfinished streams with an in-band error (exit 0); a second SIGINT stops at once;
an engine that dies makes the process exit 1 with a one-line cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import sys
from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.serve import FAILURE_LINGER_S
from vllm_mlx_trio.testing.harness import free_port
from vllm_mlx_trio.testing.requests import chat_body

REPO = pathlib.Path(__file__).resolve().parent.parent
READY_DEADLINE_S = 60.0  # two busy cores may be slow to import MLX and load the model

pytestmark = pytest.mark.mlx


@attrs.define
class Server:
    proc: trio.Process
    url: str
    stderr_path: pathlib.Path

    def stderr(self) -> str:
        return self.stderr_path.read_text()


def subprocess_env() -> dict[str, str]:
    """The test's environment less any VLLM_MLX_TRIO_* setting of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_MLX_TRIO_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@contextlib.asynccontextmanager
async def running_server(
    tmp_path: pathlib.Path, demo_cache_dir: str, *overrides: str, script: str | None = None
) -> AsyncIterator[Server]:
    """Start ``serve`` (or ``python -c script serve ...``), wait until ready; always kill it."""
    port = free_port()
    sets = [f"server.port={port}", f"model.demo_cache_dir={demo_cache_dir}", *overrides]
    serve_args = ["serve", *[arg for s in sets for arg in ("--set", s)]]
    head = ["-c", script] if script is not None else ["-m", "vllm_mlx_trio.cli"]
    stderr_path = tmp_path / f"server-{port}.stderr"
    with stderr_path.open("wb") as err, (tmp_path / f"server-{port}.stdout").open("wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, *head, *serve_args], cwd=REPO, env=subprocess_env(), stdout=out, stderr=err
        )
    server = Server(proc, f"http://127.0.0.1:{port}", stderr_path)
    try:
        await wait_ready(server)
        yield server
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()


async def wait_ready(server: Server) -> None:
    """Poll /health until 200; before that only "503 loading" or no listener is acceptable."""
    seen: list[object] = []
    with trio.fail_after(READY_DEADLINE_S):
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                if server.proc.returncode is not None:
                    pytest.fail(f"server exited {server.proc.returncode}: {server.stderr()}")
                try:
                    r = await client.get(f"{server.url}/health")
                except httpx.TransportError:
                    seen.append("no listener")
                else:
                    if r.status_code == 200:
                        break
                    seen.append((r.status_code, r.json()))
                await trio.sleep(0.05)
    assert all(s in ("no listener", (503, {"status": "loading"})) for s in seen), seen


def hello_body(max_tokens: int, *, stream: bool = True) -> dict[str, object]:
    """A request for exactly ``max_tokens`` tokens, streamed one per event by default."""
    return chat_body("hello", max_tokens=max_tokens, ignore_eos=True, stream=stream, stream_interval=1)


@attrs.define
class Stream:
    """What one streaming request got: its non-empty SSE lines, and how the read ended."""

    lines: list[str] = attrs.Factory(list)
    first: trio.Event = attrs.Factory(trio.Event)
    done: trio.Event = attrs.Factory(trio.Event)
    read_error: BaseException | None = None

    def last_json(self) -> dict:
        return json.loads(self.lines[-1].removeprefix("data: "))


async def read_stream(url: str, max_tokens: int, stream: Stream) -> None:
    """POST a streaming chat completion and collect its lines until the server ends it."""
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=hello_body(max_tokens)) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if line:
                        stream.lines.append(line)
                        stream.first.set()
    except httpx.TransportError as exc:  # a cut connection: recorded, the test judges it
        stream.read_error = exc
    finally:
        stream.first.set()
        stream.done.set()


async def wait_exit(proc: trio.Process, since: float, deadline_s: float) -> tuple[int, float]:
    """The exit code and the seconds from ``since`` (a ``trio.current_time()``) to the exit;
    fails if the process is still running ``deadline_s`` after ``since``."""
    with trio.move_on_at(since + deadline_s):
        code = await proc.wait()
        return code, trio.current_time() - since
    pytest.fail(f"the server did not exit within {deadline_s} s")


async def wait_draining(url: str) -> httpx.Response:
    """Poll /health until it says "draining" (the signal has been handled)."""
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            r = await client.get(f"{url}/health")
            if r.status_code == 503 and r.json() == {"status": "draining"}:
                return r
            assert r.status_code == 200, (r.status_code, r.text)
            await trio.sleep(0.02)


async def test_sigterm_drains_in_flight_streams_refuses_new_ones_and_exits_0(tmp_path, demo_cache_dir):
    """While draining, /health says so and a new request is refused with 503; the stream
    inside finishes with its real finish_reason and [DONE]; then the process exits 0."""
    with trio.fail_after(READY_DEADLINE_S + 40):
        async with running_server(tmp_path, demo_cache_dir, "server.drain_timeout_s=30") as srv:
            stream = Stream()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stream, srv.url, 400, stream)
                await stream.first.wait()
                srv.proc.send_signal(signal.SIGTERM)
                sent = trio.current_time()
                with trio.fail_after(5):
                    await wait_draining(srv.url)
                async with httpx.AsyncClient(timeout=5) as client:
                    refused = await client.post(f"{srv.url}/v1/chat/completions", json=hello_body(5, stream=False))
                assert not stream.done.is_set(), "the stream ended before the drain could be seen"
            code, exit_s = await wait_exit(srv.proc, sent, 15)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "service_unavailable"
    assert stream.read_error is None and stream.lines[-1] == "data: [DONE]"
    assert json.loads(stream.lines[-2].removeprefix("data: "))["choices"][0]["finish_reason"] == "length"
    stderr = srv.stderr()
    assert code == 0, f"exit code {code}: {stderr}"
    assert "Traceback" not in stderr, stderr
    assert exit_s < 15  # ~3 s: the stream's own time, not the 30 s drain timeout


async def test_drain_deadline_ends_unfinished_streams_in_band_and_exits_0(tmp_path, demo_cache_dir):
    """A stream that cannot finish within ``drain_timeout_s`` ends with an in-band
    ``engine_unavailable`` error (the chunked response still ends cleanly); exit 0."""
    with trio.fail_after(READY_DEADLINE_S + 30):
        async with running_server(tmp_path, demo_cache_dir, "server.drain_timeout_s=2") as srv:
            stream = Stream()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stream, srv.url, 1500, stream)  # ~12 s on a CPU
                await stream.first.wait()
                srv.proc.send_signal(signal.SIGTERM)
                sent = trio.current_time()
                with trio.fail_after(10):
                    await stream.done.wait()
                ended_s = trio.current_time() - sent
            code, exit_s = await wait_exit(srv.proc, sent, 2 + 3)
    assert stream.read_error is None, f"the connection was cut: {stream.read_error!r}"
    error = stream.last_json()["error"]
    assert error["code"] == "engine_unavailable" and "shutting down" in error["message"]
    assert "data: [DONE]" not in stream.lines
    assert ended_s < 2, f"the stream ended {ended_s:.1f} s after SIGTERM"
    stderr = srv.stderr()
    assert code == 0, f"exit code {code} after {exit_s:.1f} s: {stderr}"
    assert "Traceback" not in stderr, stderr


async def test_a_second_sigint_stops_at_once(tmp_path, demo_cache_dir):
    """The first SIGINT starts a drain of up to 60 s; the second cancels everything
    (``serve_until_signalled`` cancels its nursery and returns the signal), so the process
    exits within seconds with code 130 (128 + SIGINT) through ``os._exit``."""
    with trio.fail_after(READY_DEADLINE_S + 30):
        async with running_server(tmp_path, demo_cache_dir, "server.drain_timeout_s=60") as srv:
            stream = Stream()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_stream, srv.url, 2000, stream)  # ~16 s on a CPU
                await stream.first.wait()
                srv.proc.send_signal(signal.SIGINT)
                with trio.fail_after(5):
                    await wait_draining(srv.url)
                srv.proc.send_signal(signal.SIGINT)
                code, exit_s = await wait_exit(srv.proc, trio.current_time(), 10)
                with trio.fail_after(5):
                    await stream.done.wait()
    stderr = srv.stderr()
    assert exit_s < 5, f"exited (code {code}) {exit_s:.1f} s after the second SIGINT"
    assert "second SIGINT: stopping now" in stderr
    assert "data: [DONE]" not in stream.lines  # it was stopped, not finished
    # 128 + SIGINT, and never -SIGABRT: the process leaves without finalizing the interpreter
    # while the abandoned MLX thread may still be inside a step.
    assert code == 130, f"exit code {code}: {stderr}"
    assert "terminate called" not in stderr


#: Runs the CLI with ``BatchRunner.execute`` failing from its FAIL_AT-th call on.
ENGINE_DEATH_SCRIPT = """
import sys
from vllm_mlx_trio import cli
from vllm_mlx_trio.worker.batched.runner import BatchRunner

FAIL_AT = 30
original = BatchRunner.execute
calls = 0

def execute(self, plan):
    global calls
    calls += 1
    if calls >= FAIL_AT:
        raise RuntimeError(f"injected failure at call {calls}")
    return original(self, plan)

BatchRunner.execute = execute
sys.exit(cli.main(sys.argv[1:]))
"""


async def test_engine_death_fails_the_stream_then_the_process_exits_1(tmp_path, demo_cache_dir):
    """The open stream gets the cause in-band, /health is 503 "failed" while the process
    lingers (FAILURE_LINGER_S), then it exits 1 with a one-line cause on stderr."""
    with trio.fail_after(READY_DEADLINE_S + 30):
        async with running_server(tmp_path, demo_cache_dir, script=ENGINE_DEATH_SCRIPT) as srv:
            stream = Stream()
            await read_stream(srv.url, 1000, stream)
            failed = trio.current_time()
            async with httpx.AsyncClient(timeout=FAILURE_LINGER_S) as client:
                health = await client.get(f"{srv.url}/health")
            code, exit_s = await wait_exit(srv.proc, failed, FAILURE_LINGER_S + 5)
    assert stream.read_error is None, f"the connection was cut: {stream.read_error!r}"
    error = stream.last_json()["error"]
    assert error["code"] == "engine_failed" and "injected failure at call 30" in error["message"]
    assert "data: [DONE]" not in stream.lines
    assert health.status_code == 503 and health.json()["status"] == "failed", health.text
    stderr = srv.stderr()
    assert code == 1, f"exit code {code} after {exit_s:.1f} s: {stderr}"
    causes = [line for line in stderr.splitlines() if line.startswith("vllm-mlx-trio:")]
    assert len(causes) == 1 and "injected failure at call 30" in causes[0], stderr
