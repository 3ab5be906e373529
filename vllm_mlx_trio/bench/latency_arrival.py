"""``bench latency --scenario long-arrival``: a long prompt arriving while streams decode.

Per server and repetition, two rounds, servers alternating: ``alone``, ``streams`` streamed
chats with short fresh prompts decode to the end; ``arrival``, the same, and once every stream
has had ``settle`` pieces, one fresh ``long_tokens`` prompt is sent. The streams' inter-token
latency alone (every gap after ``settle`` pieces) is compared with their gaps while the long
prompt is prefilled (gaps overlapping the time from its sending to its first token), and the long
prompt's TTFT is reported. The issue's target: ITL p95 during the arrival <= 2x ITL p50 alone.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Sequence

import attrs
import httpx
import trio

from .http_bench import BenchError, HttpTarget, _content
from .latency_prompts import PromptMaker
from .stats import percentile

FIGURES = ("alone_itl_p50_ms", "alone_itl_p95_ms", "arrival_itl_p50_ms", "arrival_itl_p95_ms", "arrival_itl_max_ms",
           "long_ttft_ms", "p95_over_alone_p50")  # fmt: skip


@attrs.frozen(kw_only=True)
class ArrivalWorkload:
    streams: int = 4
    stream_prompt_tokens: int = 50
    stream_max_tokens: int = 256
    long_tokens: int = 2000
    long_max_tokens: int = 4
    #: Pieces each stream gets before the gaps count (and before the long prompt is sent).
    settle: int = 8
    repetitions: int = 3


async def timed_stream(http: httpx.AsyncClient, target: HttpTarget, prompt: str, max_tokens: int,
                       on_piece: Callable[[int], None] = lambda n: None) -> tuple[float, list[float]]:  # fmt: skip
    """Send one streamed chat: (send time, arrival time of each content chunk)."""
    start, times = time.perf_counter(), []
    async with http.stream("POST", target.chat_url, json=target.body(prompt, max_tokens)) as resp:
        if resp.status_code != 200:
            raise BenchError(f"{target.chat_url} answered {resp.status_code}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            if _content(json.loads(line[5:])):
                times.append(time.perf_counter())
                on_piece(len(times))
    return start, times


def gaps(times: Sequence[float], *, after: int = 0, window: tuple[float, float] | None = None) -> list[float]:
    """Seconds between consecutive pieces, from piece ``after`` on, or those overlapping
    ``window`` (a stream frozen through the whole window gives the one gap spanning it)."""
    pairs = zip(times[after:], times[after + 1 :], strict=False)
    if window is None:
        return [b - a for a, b in pairs]
    return [b - a for a, b in pairs if b > window[0] and a < window[1]]


async def one_round(http: httpx.AsyncClient, target: HttpTarget, maker: PromptMaker, tag: str,
                    work: ArrivalWorkload, *, arrival: bool) -> dict:  # fmt: skip
    """The streams' gaps (and the long prompt's timing when ``arrival``)."""
    settled = trio.Semaphore(0)
    streams: list[list[float]] = []
    long_timing: list[tuple[float, list[float]]] = []

    def on_piece(n: int) -> None:
        if n == work.settle:
            settled.release()

    async def stream(prompt: str) -> None:
        _start, times = await timed_stream(http, target, prompt, work.stream_max_tokens, on_piece)
        streams.append(times)

    async def long_prompt() -> None:
        for _ in range(work.streams):
            await settled.acquire()
        prompt = maker.make(f"{tag}.long", work.long_tokens)
        long_timing.append(await timed_stream(http, target, prompt, work.long_max_tokens))

    async with trio.open_nursery() as nursery:
        for i in range(work.streams):
            nursery.start_soon(stream, maker.make(f"{tag}.{i}", work.stream_prompt_tokens))
        if arrival:
            nursery.start_soon(long_prompt)
    if not arrival:
        return {"gaps": [g for t in streams for g in gaps(t, after=work.settle)]}
    sent, long_times = long_timing[0]
    first = long_times[0] if long_times else sent
    window = [g for t in streams for g in gaps(t, window=(sent, first))]
    return {"gaps": window, "long_ttft_s": first - sent, "streams_outlasted": all(t[-1] > first for t in streams)}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def arrival_row(name: str, rep: int, alone: dict, during: dict) -> dict:
    alone_p50 = percentile(alone["gaps"], 50)
    during_p95 = percentile(during["gaps"], 95)
    return {
        "path": name, "rep": rep, "alone_gaps": len(alone["gaps"]), "arrival_gaps": len(during["gaps"]),
        "alone_itl_p50_ms": _ms(alone_p50), "alone_itl_p95_ms": _ms(percentile(alone["gaps"], 95)),
        "arrival_itl_p50_ms": _ms(percentile(during["gaps"], 50)), "arrival_itl_p95_ms": _ms(during_p95),
        "arrival_itl_max_ms": _ms(max(during["gaps"], default=None)),
        "long_ttft_ms": _ms(during["long_ttft_s"]), "outlasted": during["streams_outlasted"],
        "p95_over_alone_p50": round(during_p95 / alone_p50, 2) if during_p95 and alone_p50 else None,
    }  # fmt: skip


def _spread(values: list[float]) -> str | None:
    if not values:
        return None
    median = statistics.median(values)
    return f"{median:.1f} ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else f"{median:.1f}"


def median_arrival_rows(rows: Sequence[dict]) -> list[dict]:
    """Per server: each figure's median over the repetitions, with its spread (min-max)."""
    table = []
    for path in dict.fromkeys(r["path"] for r in rows):
        mine = [r for r in rows if r["path"] == path]
        out = {"path": path, "reps": len(mine), "outlasted": sum(r["outlasted"] for r in mine),
               "arrival_gaps": statistics.median(r["arrival_gaps"] for r in mine)}  # fmt: skip
        for figure in FIGURES:
            out[figure] = _spread([r[figure] for r in mine if r.get(figure) is not None])
        table.append(out)
    return table


async def measure_arrival(targets: Sequence[tuple[str, HttpTarget]], http: httpx.AsyncClient,
                          work: ArrivalWorkload, maker: PromptMaker, progress=print) -> list[dict]:  # fmt: skip
    """Every (repetition, server) row; the server order rotates with the repetition."""
    rows = []
    for rep in range(work.repetitions):
        shift = rep % len(targets)
        for name, target in [*targets[shift:], *targets[:shift]]:
            alone = await one_round(http, target, maker, f"a{rep}-{name}", work, arrival=False)
            during = await one_round(http, target, maker, f"l{rep}-{name}", work, arrival=True)
            row = arrival_row(name, rep, alone, during)
            rows.append(row)
            progress(f"rep {rep} {name}: alone itl p50 {row['alone_itl_p50_ms']} ms; during the arrival itl p95 "
                     f"{row['arrival_itl_p95_ms']} ms ({row['p95_over_alone_p50']}x); long ttft "
                     f"{row['long_ttft_ms']} ms")  # fmt: skip
    return rows
