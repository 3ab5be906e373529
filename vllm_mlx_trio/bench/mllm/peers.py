"""``bench mllm-peers``: image requests against our server and mlx-vlm's own, side by side.

Each server is started in its own process on the same model directory (``bench/peers.py``),
in alternating order over ``--runs`` rounds. Three measurements per server and round, every
request a streamed chat completion with one image and a question, greedy:

- ``c1``: requests one at a time, each with an image not seen before: TTFT, and tok/s over the
  whole request (a server that sends its chunks in bursts cannot inflate it);
- ``c4``: four at once, four new images: aggregate tok/s (all tokens over the wall time), TTFT;
- ``repeat``: an image, then the same image and text three more times: the repeats' median TTFT
  (what a cache of the image's encoding, or of the whole prompt, gives back).
"""

from __future__ import annotations

import base64
import io
import json
import statistics
import time
from typing import Any

import attrs
import httpx
import trio

#: Distinct images: each request in a round gets its own colour pattern, so no cache can answer it.
IMAGE_SIDE = 224
QUESTION = "Describe this picture in one sentence."
CONCURRENCY = 4
#: Requests of the one-at-a-time row per round.
SEQUENTIAL_REQUESTS = 3
#: Repeats of the same image and text per round (the median is reported).
REPEATS = 3


def image_url(seed: int) -> str:
    """A PNG data URL whose pixels depend on ``seed``."""
    from PIL import Image

    image = Image.new("RGB", (IMAGE_SIDE, IMAGE_SIDE))
    image.putdata(
        [
            ((x * 7 + seed * 31) % 256, (y * 5 + seed * 17) % 256, (x + y + seed) % 256)
            for y in range(IMAGE_SIDE)
            for x in range(IMAGE_SIDE)
        ]
    )
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@attrs.frozen
class Timed:
    ttft_s: float
    tokens: int
    end_s: float


async def timed_request(http: httpx.AsyncClient, url: str, model: str, image: str, max_tokens: int) -> Timed:
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": QUESTION}]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first = last = None
    chunks = usage_tokens = 0
    async with http.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            raise RuntimeError(f"{resp.status_code}: {(await resp.aread())[:200]!r}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens") or 0
            for choice in event.get("choices") or ():
                if choice.get("delta", {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
                    chunks += 1
    if first is None or last is None:
        raise RuntimeError("no content streamed")
    return Timed(first - started, usage_tokens or chunks, last - started)


async def measure_server(url: str, model: str, round_index: int, max_tokens: int) -> dict[str, float]:
    seed = round_index * 100
    async with httpx.AsyncClient(timeout=300) as http:
        await timed_request(http, url, model, image_url(seed + 99), 4)  # warm-up
        sequential = [
            await timed_request(http, url, model, image_url(seed + i), max_tokens) for i in range(SEQUENTIAL_REQUESTS)
        ]
        concurrent: list[Timed] = []
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(CONCURRENCY):
                image = image_url(seed + 10 + i)

                async def one(image: str = image) -> None:
                    concurrent.append(await timed_request(http, url, model, image, max_tokens))

                nursery.start_soon(one)
        wall = time.perf_counter() - started
        repeated = image_url(seed + 50)
        cold = await timed_request(http, url, model, repeated, max_tokens)
        warm = [await timed_request(http, url, model, repeated, max_tokens) for _ in range(REPEATS)]
    return {
        "c1_ttft_ms": 1000 * statistics.median(t.ttft_s for t in sequential),
        "c1_tok_s": statistics.median(t.tokens / t.end_s for t in sequential),
        "c4_tok_s": sum(t.tokens for t in concurrent) / wall,
        "c4_ttft_ms": 1000 * statistics.median(t.ttft_s for t in concurrent),
        "repeat_cold_ttft_ms": 1000 * cold.ttft_s,
        "repeat_ttft_ms": 1000 * statistics.median(t.ttft_s for t in warm),
        "tokens_per_request": statistics.median(t.tokens for t in [*sequential, *concurrent]),
    }


def summarize(per_peer: dict[str, list[dict[str, float]]], baseline: str = "mlx-vlm") -> list[dict[str, Any]]:
    """One row per server: the median (min-max) of each measurement over the rounds, and our
    ratio to ``baseline`` for the throughput and repeat-TTFT columns."""
    rows = []
    medians: dict[str, dict[str, float]] = {}
    for name, rounds in per_peer.items():
        row: dict[str, Any] = {"server": name, "rounds": len(rounds)}
        medians[name] = {}
        for key in rounds[0] if rounds else ():
            values = [r[key] for r in rounds]
            medians[name][key] = statistics.median(values)
            row[key] = f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
        rows.append(row)
    if baseline in medians and "ours" in medians and medians[baseline]:
        ours, base = medians["ours"], medians[baseline]
        for row in rows:
            if row["server"] == "ours":
                row["c4_tok_s_vs"] = f"{ours['c4_tok_s'] / base['c4_tok_s']:.2f}x"
                row["c1_tok_s_vs"] = f"{ours['c1_tok_s'] / base['c1_tok_s']:.2f}x"
                row["repeat_ttft_vs"] = f"{ours['repeat_ttft_ms'] / base['repeat_ttft_ms']:.2f}x"
    return rows
