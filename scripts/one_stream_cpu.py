"""CPU per token at one stream: our servers against mlx-lm's raw ``generate_step`` loop, side by side.

Wall-clock tok/s swings 2-4x on a loaded 2-core box; the CPU a server process spends per token moves far less,
and at one stream it is what the raw loop's two busy threads (Python and MLX's compute) leave room for. Each
server (``NAME=CHECKOUT[:KEY=VALUE,...]``) runs ``demo:tiny`` from its checkout; this process is the client (one
streamed 256-token chat at a time, fresh prompt, greedy) and reads each server's CPU time (all threads, from
/proc) around every request, and its main thread's alone (a server's event loop; the raw loop's Python thread;
clock ticks of 10 ms, so a request's main-thread figure is coarse). The raw loop runs in a child process of its
own after each round, on a fresh 50-token prompt. Per round, each server's figures are paired with that round's
raw loop.

    python scripts/one_stream_cpu.py --rounds 12 ours=. run_ahead_off=.:engine.run_ahead_steps=1 base=/path/to/main
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid

import httpx

TOKENS = 256
RAW_LOOP = """
import random, sys, time
import mlx.core as mx
from mlx_lm.generate import generate_step
from vllm_mlx_trio.config import ModelConfig
from vllm_mlx_trio.worker.loading import load_model
model, _tokenizer, _config = load_model(ModelConfig(path="demo:tiny"))
stream = mx.new_stream(mx.default_device())
print("ready", flush=True)
for line in sys.stdin:
    prompt = mx.array([random.randrange(10, 500) for _ in range(50)], dtype=mx.uint32)
    start = time.perf_counter()
    for _token, _logprobs in generate_step(prompt, model, max_tokens=int(line), stream=stream):
        pass
    print(time.perf_counter() - start, flush=True)
"""


def thread_ticks(pid: int, tid: int | str) -> int:
    """utime + stime of one thread of ``pid`` (clock ticks; 0 once it is gone)."""
    try:
        stat = open(f"/proc/{pid}/task/{tid}/stat").read()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])


def cpu_ticks(pid: int) -> tuple[int, int]:
    """utime + stime of every thread of ``pid``, and of its main thread alone (a server's event loop,
    the raw loop's Python), in clock ticks."""
    return sum(thread_ticks(pid, tid) for tid in os.listdir(f"/proc/{pid}/task")), thread_ticks(pid, pid)


def cpu_per_token(before: tuple[int, int], after: tuple[int, int]) -> tuple[float, float]:
    return ms_per_token(after[0] - before[0]), ms_per_token(after[1] - before[1])


def ms_per_token(ticks: int) -> float:
    return ticks * 1000 / os.sysconf("SC_CLK_TCK") / TOKENS


def start_server(checkout: str, settings: list[str], port: int) -> subprocess.Popen:
    # -P: PYTHONPATH (the checkout), not the current directory, decides which copy of the package runs
    argv = [
        sys.executable,
        "-P",
        "-m",
        "vllm_mlx_trio.cli",
        "serve",
        "--set",
        "model.path=demo:tiny",
        "--set",
        f"server.port={port}",
        "--set",
        "logging.level=warning",
    ]
    for setting in settings:
        argv += ["--set", setting]
    env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(client: httpx.Client, url: str) -> None:
    for _ in range(600):
        try:
            client.get(url + "/v1/models", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not start")


def stream_one(client: httpx.Client, url: str, tokens: int) -> float:
    """Seconds for one streamed chat of ``tokens`` tokens."""
    body = {
        "model": "demo:tiny",
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} tell me a story about the sea"}],
    }
    start = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        for _line in response.iter_lines():
            pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("servers", nargs="+", metavar="NAME=CHECKOUT[:KEY=VALUE,...]")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--port", type=int, default=8961)
    args = parser.parse_args()
    servers = {}
    for i, spec in enumerate(args.servers):
        name, _, rest = spec.partition("=")
        checkout, _, settings = rest.partition(":")
        servers[name] = (
            start_server(checkout, [s for s in settings.split(",") if s], args.port + i),
            f"http://127.0.0.1:{args.port + i}",
        )
    raw = subprocess.Popen([sys.executable, "-c", RAW_LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    client = httpx.Client(timeout=120)
    try:
        assert raw.stdout is not None and raw.stdin is not None
        assert raw.stdout.readline().strip() == "ready"

        def raw_one(tokens: int) -> float:
            raw.stdin.write(f"{tokens}\n")
            raw.stdin.flush()
            return float(raw.stdout.readline())

        for _proc, url in servers.values():
            wait_ready(client, url)
            stream_one(client, url, 8)
        raw_one(8)
        rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in [*servers, "raw"]}
        for round_ in range(args.rounds):
            order = list(servers.items()) if round_ % 2 == 0 else list(servers.items())[::-1]
            for name, (proc, url) in order:
                before = cpu_ticks(proc.pid)
                seconds = stream_one(client, url, TOKENS)
                rows[name].append((TOKENS / seconds, *cpu_per_token(before, cpu_ticks(proc.pid))))
            before = cpu_ticks(raw.pid)
            seconds = raw_one(TOKENS)
            rows["raw"].append((TOKENS / seconds, *cpu_per_token(before, cpu_ticks(raw.pid))))
        report(rows)
    finally:
        raw.terminate()
        for proc, _url in servers.values():
            proc.terminate()
            proc.wait()


def report(rows: dict[str, list[tuple[float, float, float]]]) -> None:
    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} ({min(values):.2f}-{max(values):.2f})"

    for name, values in rows.items():
        print(
            f"{name:10s} tok/s {spread([v[0] for v in values])}  CPU ms/token {spread([v[1] for v in values])}"
            f"  main thread {spread([v[2] for v in values])}"
        )
    for name, values in rows.items():
        if name != "raw":
            pairs = list(zip(values, rows["raw"], strict=True))
            print(
                f"{name:10s} / raw, paired by round: tok/s {spread([a[0] / b[0] for a, b in pairs])}"
                f"  CPU per token {spread([a[1] / b[1] for a, b in pairs])}"
            )


if __name__ == "__main__":
    main()
