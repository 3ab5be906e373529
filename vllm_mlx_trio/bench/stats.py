"""Timing records and the figures every benchmark table reports.

A request is traced as its start time and the arrival time of each piece of output with the
number of tokens in it (one token per piece for mlx-lm's loops, one delta for the engine, one
streamed chunk for HTTP). Every figure below is computed from such traces, the same way for
every path, so the rows of a table are comparable.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

import attrs


@attrs.frozen(kw_only=True)
class RequestTrace:
    """One request: when it started, when its output arrived, and what it counted."""

    #: ``time.perf_counter()`` when the request was sent (inserted, submitted).
    start: float
    #: ``(arrival time, tokens in that piece)`` for each piece that carried tokens.
    arrivals: tuple[tuple[float, float], ...]
    #: Completion tokens, from the most authoritative count the path has.
    completion_tokens: int
    #: Prompt tokens, when the path reports them.
    prompt_tokens: int | None = None
    #: When the request's stream ended (after its last piece).
    end: float | None = None

    @property
    def finish(self) -> float:
        if self.end is not None:
            return self.end
        return self.arrivals[-1][0] if self.arrivals else self.start

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals[0][0] - self.start if self.arrivals else None

    @property
    def decode_tps(self) -> float | None:
        """Tokens per second after the first piece: the request's steady decode speed."""
        if len(self.arrivals) < 2:
            return None
        tokens = sum(n for _t, n in self.arrivals[1:])
        elapsed = self.arrivals[-1][0] - self.arrivals[0][0]
        return tokens / elapsed if elapsed > 0 else None

    def itl_samples(self) -> list[tuple[float, float]]:
        """``(seconds per token, weight in tokens)`` for each piece after the first."""
        samples = []
        for (prev, _), (now, tokens) in itertools.pairwise(self.arrivals):
            if tokens > 0:
                samples.append(((now - prev) / tokens, tokens))
        return samples


def percentile(values: Sequence[float], q: float, weights: Sequence[float] | None = None) -> float | None:
    """The ``q``-th percentile (0..100); None for no values.

    Unweighted: linear interpolation between closest ranks (numpy's default). Weighted: the
    smallest value whose cumulative weight reaches ``q`` percent of the total.
    """
    if not values:
        return None
    if weights is None:
        ordered = sorted(values)
        pos = (len(ordered) - 1) * q / 100
        low, high = math.floor(pos), math.ceil(pos)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
    pairs = sorted(zip(values, weights, strict=True))
    target, total = sum(weights) * q / 100, 0.0
    for value, weight in pairs:
        total += weight
        if total >= target:
            return value
    return pairs[-1][0]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def tokens_per_request(traces: Sequence[RequestTrace]) -> str:
    """``"128"`` when every request counted the same, else ``"min-max"``."""
    counts = [t.completion_tokens for t in traces]
    low, high = min(counts, default=0), max(counts, default=0)
    return str(low) if low == high else f"{low}-{high}"


def summarize(path: str, concurrency: int, traces: Sequence[RequestTrace], *, wall_s: float | None = None) -> dict:
    """One table row: aggregate and per-request speed, TTFT and inter-token latency."""
    if wall_s is None and traces:
        wall_s = max(t.finish for t in traces) - min(t.start for t in traces)
    completion = sum(t.completion_tokens for t in traces)
    prompts = [t.prompt_tokens for t in traces if t.prompt_tokens is not None]
    ttfts = [t.ttft_s for t in traces if t.ttft_s is not None]
    rates = [r for t in traces if (r := t.decode_tps) is not None]
    samples = [s for t in traces for s in t.itl_samples()]
    itl, weights = [s for s, _ in samples], [w for _, w in samples]
    return {
        "path": path,
        "conc": concurrency,
        "reqs": len(traces),
        "tok_per_req": tokens_per_request(traces),
        "prompt_tok": round(sum(prompts) / len(prompts)) if prompts else None,
        "agg_tok_s": _round(completion / wall_s if wall_s else None),
        "req_tok_s": _round(percentile(rates, 50)),
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p95_ms": _ms(percentile(ttfts, 95)),
        "itl_p50_ms": _ms(percentile(itl, 50, weights)),
        "itl_p95_ms": _ms(percentile(itl, 95, weights)),
        "wall_s": _round(wall_s, 2),
    }


def add_ratio(row: dict, ceiling_tok_s: float | None) -> dict:
    """Set ``vs_ceiling``: the row's aggregate tokens/s over the matching ceiling figure."""
    agg = row.get("agg_tok_s")
    row["vs_ceiling"] = round(agg / ceiling_tok_s, 3) if agg and ceiling_tok_s else None
    return row


def median_spread(values: Sequence[float], digits: int = 1) -> str:
    """``"12.3 (11.0-14.1)"``: the median of ``values`` and their range."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def runs_spread(runs: Sequence[dict], key: str, digits: int = 1) -> str:
    """:func:`median_spread` of ``key`` over the runs that measured it; ``"-"`` when none did."""
    values = [run[key] for run in runs if run[key] is not None]
    return median_spread(values, digits) if values else "-"
