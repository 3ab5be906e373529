"""Two replicas of the demo model behind vllm-router (cache_aware), on loopback.

    pip install 'vllm-mlx-trio[router]' vllm-router==0.1.17
    python examples/router_replicas.py

Starts two ``vllm-mlx-trio serve`` processes and a router in front of them, sends a plain and a
streamed chat completion through the router with the openai client, then five requests that
share a long system prompt, and prints how many prompt tokens each replica found in its
prefix cache (the router keeps the shared prefix on one replica). Stops everything at the end.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

ROUTER = Path(sys.executable).with_name("vllm-router")
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12
READY_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {READY_S} s")


@contextlib.contextmanager
def started(argv: list[str], ready_url: str) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(ready_url, proc)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def prefix_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M))


def main(*serve_overrides: str) -> dict:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    front_port = free_port()
    front = f"http://127.0.0.1:{front_port}"

    def serve(port: int) -> list[str]:
        sets = [f"server.port={port}", "cache.block_size=16", *serve_overrides]
        return [sys.executable, "-m", "vllm_mlx_trio.cli", "serve", *[a for s in sets for a in ("--set", s)]]

    router = [
        str(ROUTER),
        "--port",
        str(front_port),
        "--prometheus-port",
        str(free_port()),
        "--policy",
        "cache_aware",
        "--worker-urls",
        *urls,
    ]
    with (
        started(serve(ports[0]), f"{urls[0]}/health"),
        started(serve(ports[1]), f"{urls[1]}/health"),
        started(router, f"{front}/v1/models"),
    ):
        client = openai.OpenAI(base_url=f"{front}/v1", api_key="none")
        hello = [{"role": "user", "content": "Hello!"}]
        plain = client.chat.completions.create(model="demo:tiny", messages=hello, max_tokens=8)
        stream = client.chat.completions.create(model="demo:tiny", messages=hello, max_tokens=8, stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        for i in range(5):
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}?"}]
            client.chat.completions.create(model="demo:tiny", messages=messages, max_tokens=4)
        hits = [prefix_hits(url) for url in urls]
    print(f"plain:    {plain.choices[0].message.content!r}")
    print(f"streamed: {streamed!r}")
    print(f"prefix-cache hit tokens per replica: {hits}")
    return {"plain": plain.choices[0].message.content, "streamed": streamed, "hits": hits}


if __name__ == "__main__":
    main(*sys.argv[1:])
