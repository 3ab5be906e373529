"""``bench router``: replicas behind vllm-router, and sharded serving, against one process.

Every target is a real server process (or two) on loopback, started once; the rounds then
alternate over the targets, each round running ``bench http``'s levels against each, so a
busy machine slows every target alike. The table gives each target's median and spread
(min-max) over the rounds of aggregate tok/s and ITL p50.

Targets (``--targets``, in this order):
- ``direct``: one replica, requests straight to it;
- ``router-1``: vllm-router in front of that replica (the router's own cost);
- ``router-2``: vllm-router in front of two replicas (``--policy``, default round_robin);
- ``tp-2``: two ranks, tensor-parallel over the ring backend on loopback (rank 0 serves HTTP);
- ``pp-2``: two ranks, pipeline-parallel (the model's architecture must support it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence

import attrs
import trio

from .http import BenchError, bench_url
from .peers import OUR_PYTHON, _log_tail, _our_pythonpath, port_free, stop, wait_ready
from .report import format_table
from .workload import Workload

TARGETS = ("direct", "router-1", "router-2", "tp-2", "pp-2")
DEFAULT_TARGETS = ("direct", "router-1", "router-2", "tp-2")
COLUMNS = ("target", "conc", "rounds", "agg_tok_s", "agg_tok_s_spread", "itl_p50_ms", "itl_p50_ms_spread")
#: Two pipeline stages, each with whole layers.
PIPELINE_SETS = ("distributed.pipeline=2", "distributed.tensor=1")
ROUTER = pathlib.Path(sys.executable).with_name("vllm-router")


@attrs.frozen(kw_only=True)
class RouterBenchArgs:
    model_dir: str
    targets: tuple[str, ...] = DEFAULT_TARGETS
    rounds: int = 3
    policy: str = "round_robin"
    port: int = 8731
    startup_timeout_s: float = 180.0


class _Ports:
    def __init__(self, first: int):
        self._next = first

    def take(self) -> int:
        while not port_free(self._next):
            self._next += 1
        self._next += 1
        return self._next - 1


def _serve_argv(model_dir: str, port: int, *sets: str) -> list[str]:
    settings = [f"model.path={model_dir}", f"server.port={port}", "logging.level=warning", *sets]
    return [*OUR_PYTHON, "-m", "vllm_mlx_trio.cli", "serve", *[a for s in settings for a in ("--set", s)]]


def _start(argv: Sequence[str], log: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": _our_pythonpath(), **(env or {})}
    with log.open("wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=out, env=full_env, start_new_session=True)


@contextlib.contextmanager
def started_targets(args: RouterBenchArgs, scratch: pathlib.Path) -> Iterator[dict[str, str]]:
    """Start what the targets need; yield {target: base URL}; stop everything at the end."""
    ports, procs, urls = _Ports(args.port), [], {}

    def start(name: str, argv: Sequence[str], url: str) -> str:
        procs.append(_start(argv, scratch / f"{name}.log"))
        _ready(procs[-1], url, args.startup_timeout_s, scratch / f"{name}.log")
        return url

    try:
        needs_replicas = {"direct", "router-1", "router-2"} & set(args.targets)
        replicas = []
        for i in range(2 if "router-2" in args.targets else 1 if needs_replicas else 0):
            port = ports.take()
            argv = _serve_argv(args.model_dir, port, "cache.block_size=16")
            replicas.append(start(f"replica{i}", argv, f"http://127.0.0.1:{port}"))
        if "direct" in args.targets:
            urls["direct"] = replicas[0]
        for name, workers in (("router-1", replicas[:1]), ("router-2", replicas[:2])):
            if name in args.targets:
                port = ports.take()
                urls[name] = start(
                    name, _router_argv(port, ports.take(), workers, args.policy), f"http://127.0.0.1:{port}"
                )
        for name, sharding in (("tp-2", ("distributed.tensor=2",)), ("pp-2", PIPELINE_SETS)):
            if name in args.targets:
                urls[name] = _start_ranks(name, sharding, args, ports, scratch, procs)
        yield urls
    finally:
        for proc in reversed(procs):
            stop(proc)


def _router_argv(port: int, metrics_port: int, workers: list[str], policy: str) -> list[str]:
    if not ROUTER.exists():
        raise BenchError(f"vllm-router is not installed next to {sys.executable} (the test extra has it)")
    return [
        str(ROUTER),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(metrics_port),
        "--policy",
        policy,
        "--worker-urls",
        *workers,
        "--log-level",
        "warning",
    ]


def _start_ranks(
    name: str,
    sharding: tuple[str, ...],
    args: RouterBenchArgs,
    ports: _Ports,
    scratch: pathlib.Path,
    procs: list[subprocess.Popen],
) -> str:
    """Two ranks as ``mlx.launch --backend ring`` starts them: a loopback hostfile, ``MLX_RANK`` each."""
    hostfile = scratch / f"{name}-hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{ports.take()}"], [f"127.0.0.1:{ports.take()}"]]))
    port = ports.take()
    sets = ("engine.mode=distributed", "distributed.backend=ring", *sharding, "cache.block_size=16")
    for rank in (0, 1):
        env = {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
        procs.append(_start(_serve_argv(args.model_dir, port, *sets), scratch / f"{name}-rank{rank}.log", env))
    url = f"http://127.0.0.1:{port}"
    _ready(procs[-2], url, args.startup_timeout_s, scratch / f"{name}-rank0.log", scratch / f"{name}-rank1.log")
    return url


def _ready(proc: subprocess.Popen, url: str, timeout_s: float, *logs: pathlib.Path) -> None:
    """Wait for the server; on failure, the error names it and ends with its log's tail."""
    try:
        wait_ready(proc, url, timeout_s)
    except BenchError as exc:
        tails = "\n".join(f"--- {log.name}:\n{_log_tail(log)}" for log in logs)
        raise BenchError(f"{logs[0].stem}: {exc}\n{tails}") from None


def run_rounds(urls: dict[str, str], workload: Workload, rounds: int, model: str) -> dict[str, list[dict]]:
    """Each round runs every target once, in order: {target: [its row per round and level]}."""
    rows: dict[str, list[dict]] = {name: [] for name in urls}
    for _ in range(rounds):
        for name, url in urls.items():
            result = trio.run(
                lambda url=url, name=name: bench_url(
                    url, workload, model=model, ignore_eos="on", label=name, seeds=False
                )
            )
            rows[name].extend(result["rows"])
    return rows


def summary_rows(rows: dict[str, list[dict]]) -> list[dict]:
    """Per target and concurrency: the median and min-max of agg tok/s and ITL p50 over the rounds."""
    table = []
    for name, measured in rows.items():
        for conc in sorted({row["conc"] for row in measured}):
            level = [row for row in measured if row["conc"] == conc]
            table.append(
                {
                    "target": name,
                    "conc": conc,
                    "rounds": len(level),
                    **_median_spread("agg_tok_s", [r["agg_tok_s"] for r in level]),
                    **_median_spread("itl_p50_ms", [r["itl_p50_ms"] for r in level]),
                }
            )
    return table


def _median_spread(key: str, values: list[float | None]) -> dict:
    known = [v for v in values if v is not None]
    if not known:
        return {key: None, f"{key}_spread": None}
    return {key: round(statistics.median(known), 1), f"{key}_spread": f"{min(known):.1f}-{max(known):.1f}"}


def run_router_bench(args: RouterBenchArgs, workload: Workload) -> dict:
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        raise BenchError(f"unknown targets {sorted(unknown)}; known: {', '.join(TARGETS)}")
    with (
        tempfile.TemporaryDirectory(prefix="bench-router-") as scratch,
        started_targets(args, pathlib.Path(scratch)) as urls,
    ):
        rows = run_rounds(urls, workload, args.rounds, args.model_dir)
    table = summary_rows(rows)
    print(format_table(table, COLUMNS))
    return {"targets": list(args.targets), "rounds": args.rounds, "policy": args.policy, "rows": table, "raw": rows}
