"""``vllm-mlx-trio bench models``: several models behind one server (``[[models]]``).

Table 1, time to first token over HTTP (a streamed chat request, ``max_tokens`` 1) for model
A: cold (the first request of the process loads it), warm (loaded), and after an eviction (a
budget that holds one model; a request for B unloaded A, so A loads again: from the page cache,
as a production reload would). Table 2, two loaded models served at once: the same requests
split over both, with ``server.model_steps`` "concurrent" and "exclusive" alternated in one run.
"""

from __future__ import annotations

import functools
import json
import statistics
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio

from ..config import EngineConfig, config_from_dict, config_to_dict
from ..models.serve import serve_models
from .workload import bench_prompts, chat

#: Models when the configuration has no ``[[models]]``: two chat demos of different sizes.
DEFAULT_MODELS = ("demo:small", "demo:tiny")
#: Budget above the larger model's footprint that still holds only one (MiB).
ONE_MODEL_MARGIN_MB = 1


def models_cfg(cfg: EngineConfig, paths: Sequence[str], *, memory_mb: int | None, steps: str = "concurrent"):
    """``cfg`` serving ``paths`` as ``[[models]]`` "a", "b"... (or its own entries), on a free port."""
    data = config_to_dict(cfg)
    models = data.pop("models", None) or [{"name": chr(ord("a") + i), "path": p} for i, p in enumerate(paths)]
    data = {section: {k: v for k, v in table.items() if v is not None} for section, table in data.items()}
    server = {**data["server"], "port": 0, "model_steps": steps}
    if memory_mb is not None:
        server["model_memory_mb"] = memory_mb
    return config_from_dict({**data, "server": server, "models": models})


@asynccontextmanager
async def running(cfg: EngineConfig) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve_models, cfg, shutdown_trigger=stop.wait))
        async with httpx.AsyncClient(base_url=binds[0], timeout=600) as client:
            yield binds[0], client
        stop.set()


async def stream_chat(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(seconds to the first content token, completion tokens) of one streamed chat request."""
    body = {
        "model": model,
        "messages": chat(prompt),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            choices = chunk.get("choices") or [{}]
            if first is None and choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return (first if first is not None else time.perf_counter() - start), tokens


async def footprints_mb(client: httpx.AsyncClient) -> dict[str, int]:
    status = (await client.get("/v1/status")).json()
    return {model["name"]: model["memory_mb"] for model in status["models"]}


async def measure_ttft(cfg: EngineConfig, paths: Sequence[str], samples: int) -> tuple[list[dict], dict[str, int]]:
    """Table 1's rows, and the models' footprints in MiB."""
    prompts = bench_prompts(samples * 3 + 2)
    times: dict[str, list[float]] = {"cold": [], "warm": [], "after eviction": []}
    async with running(models_cfg(cfg, paths, memory_mb=None)) as (_url, client):
        times["cold"].append((await stream_chat(client, "a", prompts[0], 1))[0])
        for prompt in prompts[1 : samples + 1]:
            times["warm"].append((await stream_chat(client, "a", prompt, 1))[0])
        await stream_chat(client, "b", prompts[-1], 1)
        sizes = await footprints_mb(client)
    budget = max(sizes.values()) + ONE_MODEL_MARGIN_MB
    async with running(models_cfg(cfg, paths, memory_mb=budget)) as (_url, client):
        await stream_chat(client, "a", prompts[-1], 1)
        for prompt in prompts[samples + 1 : 2 * samples + 1]:
            await stream_chat(client, "b", prompt, 1)  # unloads a
            times["after eviction"].append((await stream_chat(client, "a", prompt, 1))[0])
    rows = [
        {
            "model_a": paths[0],
            "case": case,
            "samples": len(values),
            "ttft_p50_ms": round(statistics.median(values) * 1000, 1),
            "ttft_max_ms": round(max(values) * 1000, 1),
        }
        for case, values in times.items()
    ]
    return rows, sizes


async def measure_steps(
    cfg: EngineConfig, paths: Sequence[str], requests: int, max_tokens: int, rounds: int
) -> list[dict]:
    """Table 2's rows: ``requests`` streams per model at once, both models loaded, per mode."""
    results: dict[str, list[tuple[float, list[float], int]]] = {"concurrent": [], "exclusive": []}
    prompts = bench_prompts(requests)
    for _ in range(rounds):
        for steps in results:
            async with running(models_cfg(cfg, paths, memory_mb=None, steps=steps)) as (_url, client):
                for model in ("a", "b"):
                    await stream_chat(client, model, prompts[0], 2)  # load and warm both
                results[steps].append(await _both_at_once(client, prompts, max_tokens))
    return [_steps_row(steps, runs, requests) for steps, runs in results.items()]


async def _both_at_once(
    client: httpx.AsyncClient, prompts: list[str], max_tokens: int
) -> tuple[float, list[float], int]:
    ttfts: list[float] = []
    tokens = 0
    start = time.perf_counter()

    async def one(model: str, prompt: str) -> None:
        nonlocal tokens
        ttft, count = await stream_chat(client, model, prompt, max_tokens)
        ttfts.append(ttft)
        tokens += count

    async with trio.open_nursery() as nursery:
        for prompt in prompts:
            for model in ("a", "b"):
                nursery.start_soon(one, model, prompt)
    return time.perf_counter() - start, ttfts, tokens


def _steps_row(steps: str, runs: list[tuple[float, list[float], int]], requests: int) -> dict[str, Any]:
    rates = [tokens / wall for wall, _ttfts, tokens in runs]
    ttfts = [t for _wall, run_ttfts, _tokens in runs for t in run_ttfts]
    return {
        "model_steps": steps,
        "streams": 2 * requests,
        "runs": len(runs),
        "agg_tok_s": round(statistics.median(rates), 1),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 1),
        "ttft_max_ms": round(max(ttfts) * 1000, 1),
    }


def with_ratio(rows: list[dict]) -> list[dict]:
    """Each row's aggregate rate over the "concurrent" row's."""
    base = next(row["agg_tok_s"] for row in rows if row["model_steps"] == "concurrent")
    return [{**row, "vs_concurrent": round(row["agg_tok_s"] / base, 2) if base else None} for row in rows]


def run(cfg: EngineConfig, args: Any) -> dict:
    """Both tables (printed by the handler), as one JSON payload."""
    paths = tuple(args.models.split(",")) if args.models else DEFAULT_MODELS
    ttft_rows, sizes = trio.run(measure_ttft, cfg, paths, args.samples)
    steps_rows = with_ratio(trio.run(measure_steps, cfg, paths, args.requests, args.max_tokens, args.rounds))
    return {"kind": "models", "models": list(paths), "memory_mb": sizes, "ttft": ttft_rows, "steps": steps_rows}
