"""``bench soak``: thousands of mixed requests against our server, then a leak check.

The server runs in this process (``127.0.0.1``, a free port). A warm-up (every malformed case
once, then ``warmup`` requests of the mix) runs first, so first-use allocations are not counted;
then the baseline is measured, the soak runs, and the same measurement is taken again
(:mod:`.probe`). The soak fails (exit code 1) on any unexpected answer, MLX active
memory above the baseline (beyond the spread of identical probe readings), RSS growth of 1 MiB
or more per 1,000 requests, or any request, prefix-cache lease, Trio task, file descriptor or
per-request object left beyond the baseline.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time

import attrs
import httpx
import trio

from ..report import format_section, format_table, write_json
from .mix import EXPECTED, MIX, SoakMismatch, SoakRequest, every_malformed_case, plan_requests, send
from .probe import PROBES, Snapshot, measure, rss_bytes

MIB = 1024 * 1024
#: The leak check's limit: RSS may grow by less than this per 1,000 requests.
RSS_LIMIT_MIB_PER_1000 = 1.0
#: Prefix-cache budget for the soak when the config sets none: small enough that the warm-up
#: fills it, so during the soak it churns at its budget (evicting, as a long-running server
#: does) instead of growing towards 20% of the machine's memory, which is not a leak.
SOAK_CACHE_MB = 4
#: Mismatches kept word for word (all are counted).
MAX_ERRORS_KEPT = 20
OUTCOMES = ("ok", "cancelled", "finished", "rejected", "error")


@attrs.frozen(kw_only=True)
class SoakOptions:
    requests: int = 2000
    concurrency: int = 16
    max_tokens: int = 16
    seed: int = 0
    #: Requests of the mix sent before the baseline (after every malformed case once): enough
    #: for the allocator's high-water mark, MLX's per-shape state and the cache to settle.
    warmup: int = 1500
    #: Requests of the mix sent after the baseline, before the soak: they refill the prefix
    #: cache the measurement emptied, and the RSS reference is taken at their last answer.
    refill: int = 1000
    #: How long to wait for the server to go quiet before each measurement.
    quiesce_timeout_s: float = 15.0
    #: A request that takes longer than this is an error.
    request_timeout_s: float = 120.0


@attrs.define
class Tally:
    """Requests sent per kind, outcomes per (kind, outcome), the mismatches."""

    sent: collections.Counter = attrs.Factory(collections.Counter)
    outcomes: collections.Counter = attrs.Factory(collections.Counter)
    num_errors: int = 0
    answered: int = 0
    errors: list[str] = attrs.Factory(list)
    #: (requests answered, RSS in bytes) every tenth of the run: flat means no leak.
    rss_samples: list[tuple[int, int | None]] = attrs.Factory(list)

    def record(self, req: SoakRequest, outcome: str) -> None:
        if outcome not in EXPECTED[req.kind]:
            self.error(req, f"outcome {outcome!r}, expected one of {sorted(EXPECTED[req.kind])}")
            return
        self.outcomes[req.kind, outcome] += 1

    def error(self, req: SoakRequest, message: str) -> None:
        self.outcomes[req.kind, "error"] += 1
        self.num_errors += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(f"{req.kind}{f' ({req.case})' if req.case else ''}: {message}")


@attrs.frozen(kw_only=True)
class SoakResult:
    options: SoakOptions
    model: str
    warmup: Tally
    refill: Tally
    tally: Tally
    baseline: Snapshot
    after: Snapshot
    #: RSS once the model is loaded, before the warm-up (its growth is not counted).
    start_rss_bytes: int | None
    #: Whether the server went quiet (no request, tasks and fds back) before the measurement.
    quiet: bool
    wall_s: float

    @property
    def rss_growth_mib_per_1000(self) -> float | None:
        """RSS at the soak's last answer less RSS at the refill's last answer, per 1,000.

        Both are read in the same state (the tail of a run of the mix, the prefix cache at
        its budget, nothing trimmed).
        Idle readings are not used for this: how much freed memory the C library can hand
        back depends on how fragmented its heap is, which moves by MiBs between two idle
        moments with the same memory in use.
        """
        if not (self.refill.rss_samples and self.tally.rss_samples):
            return None
        before, after = self.refill.rss_samples[-1][1], self.tally.rss_samples[-1][1]
        if before is None or after is None:
            return None
        return (after - before) / MIB * 1000 / self.options.requests

    def checks(self, *, rss_limit_mib: float | None = RSS_LIMIT_MIB_PER_1000) -> list[tuple[str, bool, str]]:
        """(check, passed, detail) for each condition; ``rss_limit_mib=None`` skips RSS."""
        b, a = self.baseline, self.after
        errors = self.warmup.num_errors + self.refill.num_errors + self.tally.num_errors
        grown = {k: a.objects[k] - b.objects[k] for k in a.objects if a.objects[k] > b.objects[k]}
        jitter = max(a.mlx_active_spread, b.mlx_active_spread)
        rows = [
            ("every answer as expected", errors == 0, f"{errors} mismatches"),
            ("server went quiet", self.quiet, f"within {self.options.quiesce_timeout_s:g} s"),
            (
                "MLX active memory <= baseline + probe spread",
                a.mlx_active_bytes <= b.mlx_active_bytes + jitter,
                f"{a.mlx_active_bytes - b.mlx_active_bytes:+d} B (spread {jitter} B)",
            ),
            (
                "engine holds no request",
                a.engine_idle,
                f"requests {a.engine_requests}, running {a.running}, waiting {a.waiting}",
            ),
            (
                "prefix cache: no lease, no block in use",
                a.cache_released,
                f"leases {a.cache_leased}, blocks in use {a.cache_blocks_in_use}",
            ),
            ("Trio tasks <= baseline", a.tasks <= b.tasks, f"{a.tasks - b.tasks:+d}"),
            ("open fds <= baseline", a.fds <= b.fds, f"{a.fds - b.fds:+d}"),
            ("per-request objects <= baseline", not grown, ", ".join(f"{k} +{v}" for k, v in grown.items()) or "none"),
        ]
        per_1000 = self.rss_growth_mib_per_1000
        if rss_limit_mib is not None and per_1000 is not None:
            rows.append(
                (
                    f"RSS growth < {rss_limit_mib:g} MiB per 1000 requests",
                    per_1000 < rss_limit_mib,
                    f"{per_1000:+.3f} MiB per 1000",
                )
            )
        return rows

    def failures(self, **kwargs) -> list[str]:
        return [f"{name}: {detail}" for name, ok, detail in self.checks(**kwargs) if not ok]


def soak_client(base_url: str, options: SoakOptions) -> httpx.AsyncClient:
    """The one HTTP client of a whole soak (a new client per phase would move RSS itself)."""
    limits = httpx.Limits(max_connections=options.concurrency + 8)
    return httpx.AsyncClient(base_url=base_url, timeout=httpx.Timeout(options.request_timeout_s), limits=limits)


async def run_mix(http: httpx.AsyncClient, requests: list[SoakRequest], options: SoakOptions) -> Tally:
    """``concurrency`` clients share ``requests`` through ``http``, one request at a time each."""
    tally, queue = Tally(), iter(requests)
    sample_every = max(1, len(requests) // 10)

    async def client() -> None:
        for req in queue:
            tally.sent[req.kind] += 1
            try:
                tally.record(req, await send(http, req))
            except (SoakMismatch, httpx.HTTPError, json.JSONDecodeError) as exc:
                tally.error(req, f"{type(exc).__name__}: {exc}")
            tally.answered += 1
            if tally.answered % sample_every == 0:
                tally.rss_samples.append((tally.answered, rss_bytes()))

    async with trio.open_nursery() as nursery:
        for _ in range(min(options.concurrency, len(requests))):
            nursery.start_soon(client)
    if not tally.rss_samples or tally.rss_samples[-1][0] != tally.answered:
        tally.rss_samples.append((tally.answered, rss_bytes()))  # the run's last answer
    return tally


async def run_soak(cfg, options: SoakOptions, *, executor_factory=None) -> SoakResult:
    """Start our server in-process, warm up, measure, soak, measure again."""
    from ...local_server import open_local_server

    cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, host="127.0.0.1", port=0, drain_timeout_s=1.0))
    if cfg.cache.memory_mb is None:
        cfg = attrs.evolve(cfg, cache=attrs.evolve(cfg.cache, memory_mb=SOAK_CACHE_MB))
    model, timeout = cfg.model_name, options.quiesce_timeout_s
    async with open_local_server(cfg, executor_factory=executor_factory) as srv, soak_client(srv.url, options) as http:
        start_rss = rss_bytes()
        warm = plan_requests(options.warmup, options.seed + 1, model, options.max_tokens)
        warmup = await run_mix(http, every_malformed_case(model) + warm, options)
        baseline, quiet_before = await measure(srv.engine, None, timeout)
        refill_plan = plan_requests(options.refill, options.seed + 2, model, options.max_tokens)
        refill = await run_mix(http, refill_plan, options)
        plan = plan_requests(options.requests, options.seed, model, options.max_tokens)
        started = time.perf_counter()
        tally = await run_mix(http, plan, options)
        wall_s = time.perf_counter() - started
        after, quiet = await measure(srv.engine, baseline, timeout)
    return SoakResult(
        options=options,
        model=model,
        warmup=warmup,
        refill=refill,
        tally=tally,
        baseline=baseline,
        after=after,
        start_rss_bytes=start_rss,
        quiet=quiet and quiet_before,
        wall_s=wall_s,
    )


def measurement_rows(result: SoakResult) -> list[dict]:
    """metric | baseline | after | delta."""
    b, a = result.baseline, result.after
    pairs = [
        ("MLX active bytes (lowest probe)", b.mlx_active_bytes, a.mlx_active_bytes),
        ("MLX active spread over probes", b.mlx_active_spread, a.mlx_active_spread),
        ("MLX buffer cache bytes", b.mlx_cache_bytes, a.mlx_cache_bytes),
        ("RSS KiB at the run's last answer", _last_rss_kib(result.refill), _last_rss_kib(result.tally)),
        ("RSS KiB idle, after malloc_trim", b.rss_bytes and b.rss_bytes // 1024, a.rss_bytes and a.rss_bytes // 1024),
        ("peak RSS KiB", b.max_rss_bytes // 1024, a.max_rss_bytes // 1024),
        ("open fds", b.fds, a.fds),
        ("Trio tasks", b.tasks, a.tasks),
        ("threads", b.threads, a.threads),
        ("engine requests", b.engine_requests, a.engine_requests),
        ("running + waiting", b.running + b.waiting, a.running + a.waiting),
        ("prefix-cache leases", b.cache_leased, a.cache_leased),
        ("prefix-cache hits (since start)", b.cache_hits, a.cache_hits),
        (
            "prefix blocks in use / cached",
            f"{b.cache_blocks_in_use}/{b.cache_blocks}",
            f"{a.cache_blocks_in_use}/{a.cache_blocks}",
        ),
        *((f"live {name}", b.objects[name], a.objects[name]) for name in b.objects),
    ]
    return [
        {
            "metric": name,
            "baseline": before,
            "after": now,
            "delta": f"{now - before:+d}" if isinstance(now, int) and isinstance(before, int) else "-",
        }
        for name, before, now in pairs
    ]


def outcome_rows(tally: Tally) -> list[dict]:
    """kind | sent | each outcome."""
    rows = []
    for kind, _percent in MIX:
        row = {"kind": kind, "sent": tally.sent[kind]}
        rows.append(row | {o: tally.outcomes[kind, o] for o in OUTCOMES})
    total = {"kind": "total", "sent": sum(tally.sent.values())}
    return rows + [total | {o: sum(tally.outcomes[k, o] for k, _ in MIX) for o in OUTCOMES}]


def malloc_settings() -> str:
    """The ``MALLOC_*`` variables of the environment (glibc reads them at start): RSS depends
    on them, since the C library keeps freed memory below its high-water mark."""
    tuned = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_"))
    return tuned or "none (the C library's defaults)"


def _last_rss_kib(tally: Tally) -> int | None:
    rss = tally.rss_samples[-1][1] if tally.rss_samples else None
    return None if rss is None else rss // 1024


def _rss_notes(result: SoakResult) -> list[str]:
    """RSS before the warm-up, and every tenth of the soak (a leak grows steadily)."""
    start, warm = result.start_rss_bytes, _last_rss_kib(result.warmup)
    if start is None or warm is None:
        return []
    samples = ", ".join(f"{n}: {rss // 1024}" for n, rss in result.tally.rss_samples if rss is not None)
    return [
        f"RSS before the warm-up {start // 1024} KiB; the warm-up grew it {warm - start // 1024:+d} KiB (not counted)",
        f"RSS KiB during the soak (requests answered: RSS): {samples}",
        f"malloc settings from the environment: {malloc_settings()}",
    ]


def format_report(result: SoakResult, machine: dict) -> str:
    o = result.options
    per_1000 = result.rss_growth_mib_per_1000
    notes = [
        f"model {result.model}, {o.requests} requests, concurrency {o.concurrency}, max_tokens {o.max_tokens}, "
        f"seed {o.seed}, warm-up {o.warmup} + every malformed case once",
        f"wall {result.wall_s:.1f} s, {o.requests / result.wall_s:.1f} req/s; RSS growth "
        f"{'-' if per_1000 is None else f'{per_1000:+.3f}'} MiB per 1000 requests",
        f"one process: server and clients; MLX memory after a prefix-cache clear, over {PROBES} identical probes",
        f"RSS growth: at the soak's last answer against the last answer of {o.refill} requests run after "
        "the baseline (they refill the prefix cache the measurement emptied)",
        *_rss_notes(result),
    ]
    checks = [
        {"check": name, "result": "pass" if ok else "FAIL", "detail": detail} for name, ok, detail in result.checks()
    ]
    failed = result.failures()
    parts = [
        format_section("soak: baseline vs after", measurement_rows(result), machine, notes),
        format_table(outcome_rows(result.tally)),
        "",
        format_table(checks),
        *(f"mismatch: {line}" for line in result.warmup.errors + result.refill.errors + result.tally.errors),
        f"soak {'FAILED: ' + '; '.join(failed) if failed else 'passed'}",
    ]
    return "\n".join(parts)


def result_json(result: SoakResult, machine: dict) -> dict:
    return {
        "kind": "soak",
        "model": result.model,
        "options": attrs.asdict(result.options),
        "machine": machine,
        "baseline": attrs.asdict(result.baseline),
        "after": attrs.asdict(result.after),
        "outcomes": outcome_rows(result.tally),
        "warmup_errors": result.warmup.errors,
        "errors": result.tally.errors,
        "wall_s": round(result.wall_s, 2),
        "req_per_s": round(result.options.requests / result.wall_s, 2),
        "rss_growth_mib_per_1000": result.rss_growth_mib_per_1000,
        "malloc_settings": malloc_settings(),
        "rss_samples": result.tally.rss_samples,
        "start_rss_bytes": result.start_rss_bytes,
        "checks": [{"check": n, "passed": ok, "detail": d} for n, ok, d in result.checks()],
        "passed": not result.failures(),
    }


def run_soak_command(cfg, args: argparse.Namespace) -> int:
    """``bench soak``: print the report, write ``--json``; 1 when any check fails."""
    from ..machine import machine_info

    options = SoakOptions(
        requests=args.requests,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        seed=args.seed,
        warmup=args.warmup,
    )
    result = trio.run(run_soak, cfg, options)
    machine = machine_info()
    print(format_report(result, machine), flush=True)
    if args.json_path:
        write_json(args.json_path, result_json(result, machine))
    return 1 if result.failures() else 0
