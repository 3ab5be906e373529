"""Real ``serve`` processes and a vllm-router in front of them, on loopback, for tests/dist."""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import sys
from collections.abc import AsyncIterator

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.testing.harness import free_port

REPO = pathlib.Path(__file__).resolve().parents[2]
ROUTER = pathlib.Path(sys.executable).with_name("vllm-router")
#: Two busy cores may be slow to import MLX and load the model, or to start the router.
READY_DEADLINE_S = 90.0


@attrs.define
class Process:
    proc: trio.Process
    url: str
    log: pathlib.Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def metric(self, client: httpx.AsyncClient, name: str) -> float:
        """A counter's value from ``/metrics`` (summed over its label sets)."""
        text = (await client.get(f"{self.url}/metrics")).text
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def subprocess_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_MLX_TRIO_")}
    env["PYTHONPATH"] = str(REPO)
    return env


@contextlib.asynccontextmanager
async def started(argv: list[str], url: str, log: pathlib.Path, ready_path: str) -> AsyncIterator[Process]:
    """Start ``argv``, wait until ``GET url+ready_path`` is 200; always kill it at the end."""
    with log.open("wb") as out:
        proc = await trio.lowlevel.open_process(argv, cwd=REPO, env=subprocess_env(), stdout=out, stderr=out)
    process = Process(proc, url, log)
    try:
        await wait_ready(process, ready_path)
        yield process
    finally:
        if proc.returncode is None:
            proc.kill()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await proc.wait()


async def wait_ready(process: Process, path: str) -> None:
    with trio.fail_after(READY_DEADLINE_S):
        async with httpx.AsyncClient(timeout=5) as client:
            while True:
                if process.proc.returncode is not None:
                    pytest.fail(f"{process.proc.args} exited {process.proc.returncode}: {process.output()}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{process.url}{path}")).status_code == 200:
                        return
                await trio.sleep(0.1)


def replica(tmp_path: pathlib.Path, demo_cache_dir: str, *overrides: str):
    port = free_port()
    sets = [f"server.port={port}", f"model.demo_cache_dir={demo_cache_dir}", "cache.block_size=16", *overrides]
    argv = [sys.executable, "-m", "vllm_mlx_trio.cli", "serve", *[a for s in sets for a in ("--set", s)]]
    return started(argv, f"http://127.0.0.1:{port}", tmp_path / f"replica-{port}.log", "/health")


def router(tmp_path: pathlib.Path, workers: list[str], policy: str, *flags: str):
    port = free_port()
    argv = [
        str(ROUTER),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(free_port()),
        "--policy",
        policy,
        "--worker-urls",
        *workers,
        "--log-level",
        "info",
        *flags,
    ]
    return started(argv, f"http://127.0.0.1:{port}", tmp_path / f"router-{port}.log", "/v1/models")
