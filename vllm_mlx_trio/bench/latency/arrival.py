"""``bench latency --scenario long-arrival``: a long prompt arriving while streams decode.

Per server and repetition, two rounds, servers alternating: ``alone``, ``streams`` streamed
chats with short fresh prompts decode to the end; ``arrival``, the same, and once every stream
has had ``settle`` pieces, one fresh ``long_tokens`` prompt is sent. The streams' inter-token
latency alone (every gap after ``settle`` pieces) is compared with their gaps while the long
prompt is prefilled (gaps overlapping the time from its sending to its first token), and the long
prompt's TTFT is reported. The target: ITL p95 during the arrival <= 2x ITL p50 alone.

ITL is per token: a streamed piece may carry several tokens (run-ahead puts several decode steps
in one plan, so one SSE chunk), and a piece of k tokens after a gap g counts as k tokens each
g / k apart (percentiles weighted by tokens), what the stream's pace is as a reader sees it. The
tokens in a piece are the entries of its ``logprobs.content`` (requests ask for logprobs); a
server that streams none (``mlx_lm.server``) gets the stream's completion tokens over its pieces
for each. The longest gap (``arrival_itl_max_ms``) is between pieces, not per token: the longest
a reader saw nothing new.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import attrs
import trio

from ..http import BenchClient, HttpTarget, _content, stream_chunks
from ..stats import percentile
from .prompts import PromptMaker

FIGURES = (
    "alone_itl_p50_ms",
    "alone_itl_p95_ms",
    "arrival_itl_p50_ms",
    "arrival_itl_p95_ms",
    "arrival_itl_max_ms",
    "long_ttft_ms",
    "p95_over_alone_p50",
    "alone_p95_over_p50",
    "p95_over_alone_p95",
)


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


#: One streamed piece: (arrival time, tokens it carries).
Piece = tuple[float, float]
#: One gap before a piece: (seconds per token, tokens), a weight for the percentiles.
Gap = tuple[float, float]


def _piece_tokens(chunk: dict) -> int | None:
    """Tokens in a content chunk, from its logprobs (None: the server sent none)."""
    choices = chunk.get("choices") or []
    content = ((choices[0].get("logprobs") or {}).get("content") if choices else None) or None
    return len(content) if content is not None else None


def pieces_of(times: Sequence[float], counts: Sequence[int | None], completion_tokens: int | None) -> list[Piece]:
    """Each piece's time and tokens; a piece without a count gets the stream's mean share
    (completion tokens over pieces; one token each when the server reported neither)."""
    share = completion_tokens / len(times) if completion_tokens and times else 1.0
    return [(t, float(n) if n is not None else share) for t, n in zip(times, counts, strict=True)]


async def timed_stream(
    http: BenchClient,
    target: HttpTarget,
    prompt: str,
    max_tokens: int,
    on_piece: Callable[[int], None] = lambda n: None,
) -> tuple[float, list[Piece]]:
    """Send one streamed chat: (send time, each content chunk's arrival time and tokens)."""
    start, times, counts, usage = time.perf_counter(), [], [], None
    body = {**target.body(prompt, max_tokens), "logprobs": True}

    def on_chunk(chunk: dict) -> None:
        nonlocal usage
        if _content(chunk):
            times.append(time.perf_counter())
            counts.append(_piece_tokens(chunk))
            on_piece(len(times))
        usage = chunk.get("usage") or usage

    await stream_chunks(http, target, body, on_chunk)
    return start, pieces_of(times, counts, (usage or {}).get("completion_tokens"))


def gaps(pieces: Sequence[Piece], *, after: int = 0, window: tuple[float, float] | None = None) -> list[Gap]:
    """Per-token gaps (seconds per token, tokens) before each piece, from piece ``after`` on,
    or before the pieces whose gap overlaps ``window`` (a stream frozen through the whole
    window gives the one gap spanning it)."""
    pairs = zip(pieces[after:], pieces[after + 1 :], strict=False)
    if window is not None:
        pairs = ((a, b) for a, b in pairs if b[0] > window[0] and a[0] < window[1])
    return [((b[0] - a[0]) / b[1], b[1]) for a, b in pairs]


def _itl(gap_list: Sequence[Gap], q: float) -> float | None:
    """The ``q``-th percentile of per-token ITL, each gap weighted by its tokens."""
    return percentile([g for g, _ in gap_list], q, [n for _, n in gap_list])


async def one_round(
    http: BenchClient, target: HttpTarget, maker: PromptMaker, tag: str, work: ArrivalWorkload, *, arrival: bool
) -> dict:
    """The streams' gaps (and the long prompt's timing when ``arrival``)."""
    settled = trio.Semaphore(0)
    streams: list[list[Piece]] = []
    long_timing: list[tuple[float, list[Piece]]] = []

    def on_piece(n: int) -> None:  # on the stream's reading thread
        if n == work.settle:
            trio.from_thread.run_sync(settled.release)

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
    sent, long_pieces = long_timing[0]
    first = long_pieces[0][0] if long_pieces else sent
    window = [g for t in streams for g in gaps(t, window=(sent, first))]
    longest = max(
        (b[0] - a[0] for t in streams for a, b in zip(t, t[1:], strict=False) if b[0] > sent and a[0] < first),
        default=None,
    )
    return {
        "gaps": window,
        "longest_s": longest,
        "long_ttft_s": first - sent,
        "streams_outlasted": all(t[-1][0] > first for t in streams),
    }


def _tokens(gap_list: Sequence[Gap]) -> int:
    return round(sum(n for _, n in gap_list))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def arrival_row(name: str, rep: int, alone: dict, during: dict) -> dict:
    """One repetition's figures: ITL per token (ms), gaps counted in tokens."""
    alone_p50, alone_p95 = _itl(alone["gaps"], 50), _itl(alone["gaps"], 95)
    during_p95 = _itl(during["gaps"], 95)
    return {
        "path": name,
        "rep": rep,
        "alone_gaps": _tokens(alone["gaps"]),
        "arrival_gaps": _tokens(during["gaps"]),
        "alone_itl_p50_ms": _ms(alone_p50),
        "alone_itl_p95_ms": _ms(alone_p95),
        "arrival_itl_p50_ms": _ms(_itl(during["gaps"], 50)),
        "arrival_itl_p95_ms": _ms(during_p95),
        "arrival_itl_max_ms": _ms(during["longest_s"]),
        "long_ttft_ms": _ms(during["long_ttft_s"]),
        "outlasted": during["streams_outlasted"],
        "p95_over_alone_p50": _ratio(during_p95, alone_p50),
        # the target's ratio taken apart: the streams' own tail without the long prompt, and what it adds
        "alone_p95_over_p50": _ratio(alone_p95, alone_p50),
        "p95_over_alone_p95": _ratio(during_p95, alone_p95),
    }


def _ratio(top: float | None, bottom: float | None) -> float | None:
    return round(top / bottom, 2) if top and bottom else None


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
        out = {
            "path": path,
            "reps": len(mine),
            "outlasted": sum(r["outlasted"] for r in mine),
            "arrival_gaps": statistics.median(r["arrival_gaps"] for r in mine),
        }
        for figure in FIGURES:
            out[figure] = _spread([r[figure] for r in mine if r.get(figure) is not None])
        table.append(out)
    return table


async def measure_arrival(
    targets: Sequence[tuple[str, HttpTarget]],
    http: BenchClient,
    work: ArrivalWorkload,
    maker: PromptMaker,
    progress=print,
) -> list[dict]:
    """Every (repetition, server) row; the server order rotates with the repetition."""
    rows = []
    for rep in range(work.repetitions):
        shift = rep % len(targets)
        for name, target in [*targets[shift:], *targets[:shift]]:
            alone = await one_round(http, target, maker, f"a{rep}-{name}", work, arrival=False)
            during = await one_round(http, target, maker, f"l{rep}-{name}", work, arrival=True)
            row = arrival_row(name, rep, alone, during)
            rows.append(row)
            progress(
                f"rep {rep} {name}: alone itl p50 {row['alone_itl_p50_ms']} ms; during the arrival itl p95 "
                f"{row['arrival_itl_p95_ms']} ms ({row['p95_over_alone_p50']}x); long ttft "
                f"{row['long_ttft_ms']} ms"
            )
    return rows
