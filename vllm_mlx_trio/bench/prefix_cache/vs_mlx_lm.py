"""``bench prefix-cache --mlx-lm``: the short repeat's TTFT target over HTTP, against mlx_lm.server.

Our server and ``mlx_lm.server`` serve the same model directory at once, on two ports. In each
of ``runs`` rounds (the servers' order alternated), each gets a fresh 48-token completion
prompt 5 times at once (cold), then the same 5 again (repeat); a round's figure is the median
TTFT of the 5 streams. Rows 7a-7c give the medians over the rounds (with their spread) and
whether the target holds: our repeat at most 0.5x our cold run and at most mlx_lm.server's
repeat on the same run. ``variants`` (``NAME@CHECKOUT``) add our server from other checkouts
of this package to the same rounds (before/after in one run), each with a row of its own.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import tempfile
import time

import attrs
import httpx
import trio

from ..http import BenchError
from ..peers import peer_server, port_free, stop, wait_ready
from .table import (
    MAX_TOKENS,
    SHORT_REPEAT_CONCURRENCY,
    SHORT_REPEAT_TARGET,
    SHORT_REPEAT_TOKENS,
    Row,
    short_repeat_prompt,
)

SERVERS = ("ours", "mlx-lm")
STARTUP_TIMEOUT_S = 180.0


async def stream_ttft(http: httpx.AsyncClient, base_url: str, model: str, prompt: str) -> float:
    """Seconds to the first streamed text of one greedy completion, read to its end."""
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    start, first = time.perf_counter(), None
    async with http.stream("POST", f"{base_url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise BenchError(f"{base_url} answered {resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            choices = json.loads(line[5:]).get("choices") or []
            if first is None and choices and choices[0].get("text"):
                first = time.perf_counter() - start
    if first is None:
        raise BenchError(f"{base_url} streamed no text")
    return first


async def burst_median(http: httpx.AsyncClient, base_url: str, model: str, prompt: str) -> float:
    """The median TTFT of ``SHORT_REPEAT_CONCURRENCY`` requests of ``prompt`` sent at once."""
    ttfts: list[float] = []

    async def one() -> None:
        ttfts.append(await stream_ttft(http, base_url, model, prompt))

    async with trio.open_nursery() as nursery:
        for _ in range(SHORT_REPEAT_CONCURRENCY):
            nursery.start_soon(one)
    return statistics.median(ttfts)


async def _rounds(urls: dict[str, tuple[str, str]], tokenizer, runs: int) -> dict[str, dict[str, list[float]]]:
    figures = {name: {"cold": [], "repeat": []} for name in urls}
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as http:
        for run in range(runs):
            order = list(urls)[run % len(urls) :] + list(urls)[: run % len(urls)]  # each server first in turn
            for name in order:
                base_url, model = urls[name]
                prompt = short_repeat_prompt(tokenizer, f"Round {run} {name} {time.monotonic_ns() % 997}:")
                figures[name]["cold"].append(await burst_median(http, base_url, model, prompt))
                figures[name]["repeat"].append(await burst_median(http, base_url, model, prompt))
    return figures


def _peer(name: str, model_dir: str, port: int, scratch: str, variants: dict[str, str]):
    """``ours`` / ``mlx-lm``, or a variant: our server run from another checkout."""
    if name in variants:
        base = peer_server("ours", model_dir, port, scratch=scratch)
        return attrs.evolve(base, name=name, env={**base.env, "PYTHONPATH": variants[name]})
    return peer_server(name, model_dir, port, scratch=scratch)


def compare_with_mlx_lm(
    model_dir: str, tokenizer, *, runs: int = 3, port: int = 8711, variants: dict[str, str] | None = None
) -> list[Row]:
    """Rows 7a-7c (or one failed row saying why a server could not be measured); ``variants``:
    name -> checkout of our server to measure in the same rounds."""
    variants = variants or {}
    procs: dict[str, subprocess.Popen] = {}
    urls: dict[str, tuple[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="prefix-vs-mlx-lm-") as tmp:
        try:
            for offset, name in enumerate((*SERVERS, *variants)):
                if not port_free(port + offset):
                    raise BenchError(f"port {port + offset} is in use")
                peer = _peer(name, model_dir, port + offset, tmp, variants)
                with open(os.path.join(tmp, f"{name}.log"), "wb") as log:
                    procs[name] = subprocess.Popen(
                        peer.argv,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                        env={**os.environ, **peer.env},
                    )
                urls[name] = (f"http://127.0.0.1:{port + offset}", peer.model or model_dir)
            for name, proc in procs.items():
                wait_ready(proc, urls[name][0], STARTUP_TIMEOUT_S)
            figures = trio.run(_rounds, urls, tokenizer, runs)
        except (BenchError, httpx.HTTPError, OSError) as exc:
            return [
                Row(
                    step="7a",
                    description="48-token x5 over HTTP vs mlx_lm.server",
                    expected="measured",
                    actual=f"not measured: {exc}",
                    passed=False,
                )
            ]
        finally:
            for proc in procs.values():
                stop(proc)
    return figure_rows(figures)


def figure_rows(figures: dict[str, dict[str, list[float]]]) -> list[Row]:
    """The rows of measured rounds: each server's cold and repeat medians, then the target."""

    def median_ms(values: list[float]) -> str:
        ms = sorted(v * 1000 for v in values)
        return f"{statistics.median(ms):.0f} ms ({ms[0]:.0f}-{ms[-1]:.0f})"

    rows = []
    for step, name in zip("ab", SERVERS, strict=True):
        label = "ours" if name == "ours" else "mlx_lm.server"
        fig = figures[name]
        description = f"{label}: {SHORT_REPEAT_TOKENS}-token x{SHORT_REPEAT_CONCURRENCY} over HTTP, cold -> repeat"
        actual = f"{median_ms(fig['cold'])} -> {median_ms(fig['repeat'])}"
        rows.append(
            Row(step=f"7{step}", description=description, expected="measured", actual=actual, passed=True, info=True)
        )
    ours, peer = figures["ours"], figures["mlx-lm"]
    ratio = statistics.median(ours["repeat"]) / statistics.median(ours["cold"])
    versus = statistics.median(ours["repeat"]) / statistics.median(peer["repeat"])
    met = ratio <= SHORT_REPEAT_TARGET and versus <= 1.0
    rows.append(
        Row(
            step="7c",
            description="Repeat: / our cold, / mlx_lm.server's repeat",
            expected=f"<= {SHORT_REPEAT_TARGET}, <= 1",
            actual=f"{ratio:.2f}, {versus:.2f} (target {'met' if met else 'missed'})",
            passed=True,
            info=True,
        )
    )
    for index, name in enumerate(n for n in figures if n not in SERVERS):
        fig = figures[name]
        versus = statistics.median(fig["repeat"]) / statistics.median(peer["repeat"])
        rows.append(
            Row(
                step=f"7v{index + 1}",
                description=f"{name}: cold -> repeat (/ mlx_lm.server's repeat)",
                expected="measured",
                actual=f"{median_ms(fig['cold'])} -> {median_ms(fig['repeat'])} ({versus:.2f})",
                passed=True,
                info=True,
            )
        )
    return rows
