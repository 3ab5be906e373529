"""``bench latency``: TTFT and ITL, ours against the peers, in one run.

Every server (ours, variants of ours with other settings, ``mlx_lm.server``, vllm-mlx) runs
in its own process, all started up front; this process is only the client. For each
repetition and each concurrency level, every server gets the same kind of work in turn (the
order rotates from one repetition and level to the next, so drifts of the machine are
shared): ``level`` clients, each sending its next streamed chat when the last one ends,
``max(level, len(lengths))`` fresh prompts cycling through the lengths. A table gives, per
server and level, the median over the repetitions of each figure with its spread (min-max).

With a ceiling (mlx-lm's own loops in a child process, ``--peers ...,ceiling``) each repetition
of each level also runs the same kind of prompts through it: ``generate_step`` one request at a
time at level 1, one ``BatchGenerator`` per wave of ``level`` prompts above it. Every row gets
``vs_ceiling``: its ``agg_tok_s`` over the ceiling's at its level (medians), and
``paired_vs_ceiling``: the median over the repetitions of that ratio within each (the ceiling
runs right after the servers). The client is this process, never the server's: a server's ratio
holds the whole cost of serving its tokens over HTTP, the raw loop's none. With ``ceiling-sse``
level 1 also gets ``mlx-lm generate_step + SSE``: the same loop writing each token as its own
SSE event to a socket this process reads, the least a server that sends every token alone adds.

With stream intervals (``--intervals 1,4``) each of our servers (ours and its variants) gives one
row per interval, ``NAME-siN``: its requests carry ``stream_interval: N``. Every server row also
gets ``chunks_per_token``, its content chunks over its completion tokens (1.0: a chunk per token;
about 1/N: chunks of N), and the ceiling's per-step time (``step_ms``: its ITL p50 at one stream)
is what the ITL figures are read against.

Every row also gets ``cpu_ms_per_token``: the CPU its process used during the row (all threads,
read from ``/proc``) over its completion tokens, the ceiling's too; our servers' rows
``loop_cpu_ms_per_token``: their main thread's, the event loop; and every server's row
``client_cpu_ms_per_token``: this process's (``getrusage``), the client reading the streams
(bench/sse_client.py). CPU time moves far less with the machine's load than tokens per second,
and on a machine with few cores what a server (or the client) spends per token beside the model
comes out of the model's share.
"""

from __future__ import annotations

import contextlib
import functools
import os
import pathlib
import resource
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

import attrs
import trio

from ..ceiling.process import CeilingProcess
from ..ceiling.run import batched_waves, path_name, traces_from_runs
from ..http import BenchClient, HttpTarget, closed_loop, open_bench_client, prepare
from ..peers import PeerServer, peak_rss_mib, peer_server, port_free, stop, wait_ready
from ..proc_cpu import cpu_times, ms_per_token
from ..stats import RequestTrace, summarize
from ..workload import chat
from .arrival import ArrivalWorkload, measure_arrival, median_arrival_rows
from .prompts import PromptMaker

#: The figures a level reports, each as median (min-max) over the repetitions.
FIGURES = ("ttft_p50_ms", "ttft_p95_ms", "itl_p50_ms", "itl_p95_ms", "agg_tok_s")
#: Figures that are ratios near 1 or below, shown with two decimals.
FINE_FIGURES = ("chunks_per_token", "cpu_ms_per_token", "loop_cpu_ms_per_token", "client_cpu_ms_per_token")
WARMUP_MAX_TOKENS = 4


@attrs.frozen(kw_only=True)
class LatencyWorkload:
    levels: tuple[int, ...] = (1, 5, 16)
    lengths: tuple[int, ...] = (50, 500, 2000)
    max_tokens: int = 32
    repetitions: int = 3
    #: ``stream_interval`` values our servers run with, one row each; empty: none sent (their setting).
    intervals: tuple[int, ...] = ()

    def num_requests(self, level: int) -> int:
        return max(level, len(self.lengths))


#: ``--quick``: minutes, to iterate.
QUICK = LatencyWorkload(levels=(1, 5), lengths=(50, 500), max_tokens=16, repetitions=2)


def ours_variant(
    label: str, settings: Sequence[str], model_dir: str, port: int, *, checkout: str | None = None
) -> PeerServer:
    """Our server with extra ``--set key=value`` settings, named ``label`` in the tables; run
    from ``checkout`` (another copy of this repository: before/after in one run) if given."""
    base = peer_server("ours", model_dir, port)
    extra = tuple(arg for kv in settings for arg in ("--set", kv))
    env = base.env if checkout is None else {**base.env, "PYTHONPATH": checkout}
    return attrs.evolve(base, name=label, argv=base.argv + extra, env=env)


@attrs.define
class Running:
    peer: PeerServer
    proc: subprocess.Popen
    base_url: str


def is_ours(name: str) -> bool:
    """Our server or one of its ``--variant``s (the peers know no ``stream_interval``)."""
    return name == "ours" or name.startswith("ours-")


@attrs.define(kw_only=True)
class IntervalTarget(HttpTarget):
    """Our server with ``stream_interval: N`` in every request body.

    The interval travels in the request rather than as a variant with ``--set
    engine.stream_interval=N``: one server process per variant serves every interval, so the
    rows of one variant differ by the interval only (same process, same warm state, same memory),
    and a run with intervals starts no more processes on the machine than one without.
    """

    stream_interval: int

    def body(self, prompt: str, max_tokens: int, *, ignore_eos: bool | None = None) -> dict:
        return {**super().body(prompt, max_tokens, ignore_eos=ignore_eos), "stream_interval": self.stream_interval}


@attrs.frozen
class Lane:
    """One row's name, the target its requests go to, and the server process's pid (its CPU is read)."""

    label: str
    target: HttpTarget
    pid: int | None = None


def interval_label(name: str, interval: int) -> str:
    return f"{name}-si{interval}"


def lanes(targets: dict[str, HttpTarget], intervals: Sequence[int], pids: dict[str, int] | None = None) -> list[Lane]:
    """One lane per server (``targets`` by name, in order), or per (our server, interval) when
    ``intervals`` are given; every lane of a server shares its process (``pids`` by name)."""
    pids = pids or {}
    out = []
    for name, target in targets.items():
        if not intervals or not is_ours(name):
            out.append(Lane(name, target, pids.get(name)))
            continue
        for n in intervals:
            fields = attrs.asdict(target, recurse=False) | {"count_sources": set()}
            out.append(Lane(interval_label(name, n), IntervalTarget(**fields, stream_interval=n), pids.get(name)))
    return out


@contextlib.contextmanager
def started(
    peers: Sequence[PeerServer], first_port: int, log_dir: pathlib.Path, timeout_s: float
) -> Iterator[list[Running]]:
    """Start every server (port ``first_port + i``), wait until all answer; stop them after."""
    running: list[Running] = []
    try:
        for offset, peer in enumerate(peers):
            port = first_port + offset
            if not port_free(port):
                raise RuntimeError(f"port {port} is in use")
            with open(log_dir / f"{offset}-{peer.name}.log", "wb") as log:
                proc = subprocess.Popen(
                    peer.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env={**os.environ, **peer.env},
                )
            running.append(Running(peer, proc, f"http://127.0.0.1:{port}"))
        for server in running:
            wait_ready(server.proc, server.base_url, timeout_s)
        yield running
    finally:
        for server in running:
            stop(server.proc)


def chunks_per_token(traces: Sequence[RequestTrace]) -> float | None:
    """Content-bearing chunks (the pieces of the traces) over completion tokens: 1.0 when every
    token left in a chunk of its own, about 1/N for chunks of N; None without tokens."""
    tokens = sum(t.completion_tokens for t in traces)
    return round(sum(len(t.arrivals) for t in traces) / tokens, 3) if tokens else None


async def _one_level(lane: Lane, prompts: list[str], level: int, max_tokens: int, http: BenchClient) -> dict:
    lane.target.count_sources.clear()
    start, cpu_before, client_before = time.perf_counter(), cpu_times(lane.pid), _own_cpu_s()
    traces = await closed_loop(http, lane.target, prompts, level, max_tokens)
    row = summarize(lane.label, level, traces, wall_s=time.perf_counter() - start)
    # a server with no usage chunk has its tokens counted as its chunks: the ratio would say nothing
    row["chunks_per_token"] = chunks_per_token(traces) if lane.target.count_sources == {"usage"} else None
    add_cpu_figures(row, cpu_before, cpu_times(lane.pid), traces, event_loop=is_ours(lane.label))
    tokens = sum(t.completion_tokens for t in traces)
    row["client_cpu_ms_per_token"] = round((_own_cpu_s() - client_before) * 1000 / tokens, 3) if tokens else None
    return row


def _own_cpu_s() -> float:
    """Seconds of CPU this process (every thread) has used, to the microsecond."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def add_cpu_figures(row: dict, before, after, traces: Sequence[RequestTrace], *, event_loop: bool) -> None:
    """``cpu_ms_per_token`` (the process's CPU over the row's completion tokens) and, for our
    servers, ``loop_cpu_ms_per_token`` (their main thread's: the event loop)."""
    process, main = ms_per_token(before, after, sum(t.completion_tokens for t in traces))
    row["cpu_ms_per_token"] = process
    row["loop_cpu_ms_per_token"] = main if event_loop else None


def _rotated(items: Sequence, by: int) -> list:
    if not items:  # only mlx-lm's loops, no server
        return []
    by %= len(items)
    return [*items[by:], *items[:by]]


async def _warm_targets(
    http: BenchClient, servers: Sequence[Running], lengths: Sequence[int], maker: PromptMaker
) -> dict[str, HttpTarget]:
    targets = {}
    for server in servers:
        target = HttpTarget(base_url=server.base_url, model=server.peer.model)
        await prepare(http, target)
        warm = maker.batch(f"warm-{server.peer.name}", lengths, len(lengths))
        await closed_loop(http, target, warm, 1, WARMUP_MAX_TOKENS)
        targets[server.peer.name] = target
    return targets


async def measure_long_arrival(servers: Sequence[Running], work: ArrivalWorkload, maker: PromptMaker) -> list[dict]:
    """The long-arrival scenario's rows (see bench/latency/arrival.py)."""
    async with open_bench_client(timeout_s=900.0, max_connections=work.streams + 8) as http:
        targets = await _warm_targets(http, servers, (work.stream_prompt_tokens, work.long_tokens), maker)
        return await measure_arrival(list(targets.items()), http, work, maker)


#: The streamed ceiling's row: ``generate_step`` writing every token as its own SSE event.
STREAMED_CEILING = "mlx-lm generate_step + SSE"


async def _ceiling_row(
    ceiling: CeilingProcess, prompts: list[str], level: int, max_tokens: int, *, streamed: bool = False
) -> dict:
    """One repetition of ``level`` through mlx-lm's own loop (no EOS stop): ``generate_step`` at
    level 1 (``streamed``: each token also sent as an SSE event), else ``BatchGenerator`` waves
    of ``level`` prompts."""
    chats = [chat(p) for p in prompts]
    before = cpu_times(ceiling.pid)
    if streamed:
        runs = await trio.to_thread.run_sync(lambda: ceiling.single_streamed(chats, num_tokens=max_tokens))
    elif level == 1:
        runs = await trio.to_thread.run_sync(lambda: ceiling.single(chats, num_tokens=max_tokens))
    else:
        runs = await trio.to_thread.run_sync(lambda: batched_waves(ceiling, chats, level, max_tokens))
    traces = traces_from_runs(runs)
    row = summarize(STREAMED_CEILING if streamed else path_name(level), level, traces)
    add_cpu_figures(row, before, cpu_times(ceiling.pid), traces, event_loop=False)
    return row


async def measure(
    servers: Sequence[Running],
    workload: LatencyWorkload,
    maker: PromptMaker,
    progress=print,
    ceiling: CeilingProcess | None = None,
    ceiling_streamed: bool = False,
) -> list[dict]:
    """Every (repetition, level, server) row, servers alternating (the ceiling after them, and
    with ``ceiling_streamed`` its streamed loop after it at level 1)."""
    async with open_bench_client(timeout_s=900.0, max_connections=max(workload.levels) + 8) as http:
        targets = await _warm_targets(http, servers, workload.lengths, maker)
        every = lanes(targets, workload.intervals, {s.peer.name: s.proc.pid for s in servers})
        rows = []
        for rep in range(workload.repetitions):
            for index, level in enumerate(workload.levels):
                for lane in _rotated(every, rep + index):
                    tag = f"r{rep}-c{level}-{lane.label}"
                    prompts = maker.batch(tag, workload.lengths, workload.num_requests(level))
                    row = await _one_level(lane, prompts, level, workload.max_tokens, http)
                    row["rep"] = rep
                    rows.append(row)
                    progress(
                        f"rep {rep} conc {level} {lane.label}: ttft p50 {row['ttft_p50_ms']} ms, "
                        f"itl p50 {row['itl_p50_ms']} ms, {row['agg_tok_s']} tok/s, "
                        f"{row['chunks_per_token']} chunks/token"
                    )
                if ceiling is not None:
                    prompts = maker.batch(f"r{rep}-c{level}-ceiling", workload.lengths, workload.num_requests(level))
                    rows.append({**await _ceiling_row(ceiling, prompts, level, workload.max_tokens), "rep": rep})
                if ceiling is not None and ceiling_streamed and level == 1:
                    prompts = maker.batch(f"r{rep}-c1-ceiling-sse", workload.lengths, workload.num_requests(level))
                    row = await _ceiling_row(ceiling, prompts, level, workload.max_tokens, streamed=True)
                    rows.append({**row, "rep": rep})
    return rows


def _spread(values: list[float], digits: int = 1) -> str | None:
    if not values:
        return None
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def median_rows(rows: Sequence[dict]) -> list[dict]:
    """Per (server, level): each figure's median over the repetitions, with its spread, and the
    server's TTFT p50 over the best other server's (``ttft_vs_best``; < 1 is ahead)."""
    keys = sorted(dict.fromkeys((r["path"], r["conc"]) for r in rows), key=lambda k: (k[1], k[0]))
    table = []
    for path, conc in keys:
        mine = [r for r in rows if (r["path"], r["conc"]) == (path, conc)]
        counts = sorted({r["tok_per_req"] for r in mine})  # a server that stops at EOS shows here
        out = {
            "path": path,
            "conc": conc,
            "reps": len(mine),
            "reqs": mine[0]["reqs"],
            "prompt_tok": mine[0]["prompt_tok"],
            "tok_per_req": ",".join(counts),
        }
        for figure in (*FIGURES, *FINE_FIGURES):
            values = [r[figure] for r in mine if r.get(figure) is not None]
            out[figure] = _spread(values, 2 if figure in FINE_FIGURES else 1)
            out[f"_{figure}"] = statistics.median(values) if values else None
        table.append(out)
    for row in table:
        others = [
            r["_ttft_p50_ms"]
            for r in table
            if r["conc"] == row["conc"]
            and r["path"] != row["path"]
            and r["_ttft_p50_ms"]
            and not r["path"].startswith("ours")
            and r["path"] not in (path_name(r["conc"]), STREAMED_CEILING)
        ]
        mine = row["_ttft_p50_ms"]
        raw_loop = path_name(row["conc"])
        ours = row["path"] != raw_loop  # the ceiling is no server
        row["ttft_vs_best_peer"] = round(mine / min(others), 2) if others and mine and ours else None
        ceiling = [r["_agg_tok_s"] for r in table if r["conc"] == row["conc"] and r["path"] == raw_loop]
        row["vs_ceiling"] = round(row["_agg_tok_s"] / ceiling[0], 2) if ceiling and row["_agg_tok_s"] else None
        row["paired_vs_ceiling"] = paired_ratio(rows, row["path"], raw_loop, row["conc"])
    return table


def step_ms(table: Sequence[dict]) -> dict | None:
    """The raw loop's per-step time at one stream, from the ceiling's level-1 row (medians over
    the repetitions): ``itl_p50_ms``, and ``from_tok_s`` (1000 / its agg tok/s, which also counts
    the prefill); None without a ceiling."""
    for row in table:
        if row["path"] == path_name(1) and row["conc"] == 1:
            itl, tok_s = row.get("_itl_p50_ms"), row.get("_agg_tok_s")
            return {"itl_p50_ms": itl, "from_tok_s": round(1000 / tok_s, 2) if tok_s else None}
    return None


def paired_ratio(rows: Sequence[dict], path: str, baseline: str, conc: int) -> float | None:
    """Median over the repetitions of ``path``'s agg_tok_s over ``baseline``'s in the same repetition (they
    ran back to back, so the machine's drift between repetitions cancels); None without a common one."""
    by_rep: dict[int, dict[str, float]] = {}
    for r in rows:
        if r["conc"] == conc and r["path"] in (path, baseline) and r.get("agg_tok_s"):
            by_rep.setdefault(r["rep"], {})[r["path"]] = r["agg_tok_s"]
    ratios = [v[path] / v[baseline] for v in by_rep.values() if path in v and baseline in v]
    return round(statistics.median(ratios), 2) if ratios else None


def missing_executable(peer: PeerServer) -> bool:
    import shutil

    return not shutil.which(peer.argv[0]) and not os.path.exists(peer.argv[0])


def run_latency(
    peers: Sequence[PeerServer],
    workload: LatencyWorkload | ArrivalWorkload,
    maker: PromptMaker,
    *,
    first_port: int,
    startup_timeout_s: float,
    ceiling_cfg=None,
    ceiling_streamed: bool = False,
) -> dict:
    """Start the servers, measure ``workload`` (levels, or the long-arrival scenario), stop them.
    ``ceiling_cfg`` (an EngineConfig): also mlx-lm's own loops at every level (``ceiling_streamed``:
    and the streamed loop at level 1)."""
    arrival = isinstance(workload, ArrivalWorkload)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-latency-"))
        ceiling = None if arrival or ceiling_cfg is None else stack.enter_context(CeilingProcess(ceiling_cfg))
        with started(peers, first_port, pathlib.Path(tmp), startup_timeout_s) as servers:
            if arrival:
                rows = trio.run(measure_long_arrival, servers, workload, maker)
            else:
                measure_all = functools.partial(measure, ceiling=ceiling, ceiling_streamed=ceiling_streamed)
                rows = trio.run(measure_all, servers, workload, maker)
            rss = {s.peer.name: peak_rss_mib(s.proc.pid) for s in servers}
    table = median_arrival_rows(rows) if arrival else median_rows(rows)
    result = {"rows": rows, "table": table, "peak_rss_mib": rss, "argv": {p.name: list(p.argv) for p in peers}}
    if not arrival:
        result["step_ms"] = step_ms(table)
    return result
