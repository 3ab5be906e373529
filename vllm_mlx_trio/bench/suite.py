"""The benchmark commands' bodies: run, print each table as it is done, collect JSON.

``bench all`` runs, for each model, the ceiling, the engine and our HTTP server, one after
the other in this process, so they share the machine's conditions (and nothing else runs
between them).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import attrs
import trio

from ..config import EngineConfig
from .ceiling.run import CeilingResult, run_ceiling_bench
from .engine import MODES, run_engine_bench
from .http import bench_own_server, bench_url, http_notes
from .machine import machine_info
from .report import format_section, format_seeds, format_table
from .stats import add_ratio

Printer = Callable[[str], None]


def _print(text: str) -> None:
    print(text, flush=True)


def workload_note(cfg: EngineConfig, workload) -> str:
    return (
        f"model {cfg.model.path}, greedy, max_tokens {workload.max_tokens}, "
        f"max(concurrency, {workload.min_requests}) requests per level, each level after a warm-up"
    )


def ceiling_section(cfg: EngineConfig, workload, out: Printer = _print) -> tuple[CeilingResult, dict]:
    result = run_ceiling_bench(cfg, workload)
    section = {"kind": "ceiling", "model": cfg.model.path, "machine": result.machine, "rows": result.rows}
    notes = [workload_note(cfg, workload), "no EOS stop: mlx-lm's loops generate exactly max_tokens"]
    title = f"ceiling: mlx-lm in-process ({cfg.model.path})"
    out(format_section(title, result.rows, section["machine"], notes))
    return result, section


def engine_section(
    cfg: EngineConfig,
    workload,
    ceiling: CeilingResult | None,
    *,
    modes: Sequence[str] = MODES,
    executor_factory=None,
    out: Printer = _print,
) -> dict:
    rows = run_engine_bench(cfg, workload, modes=modes, ceiling=ceiling, executor_factory=executor_factory)
    section = {"kind": "engine", "model": cfg.model.path, "machine": machine_info(), "rows": rows}
    notes = [workload_note(cfg, workload), "SamplingParams(temperature=0, ignore_eos=True); see tok_per_req"]
    out(format_section(f"engine in-process ({cfg.model.path})", rows, section["machine"], notes))
    return section


def http_section(
    cfg: EngineConfig,
    workload,
    *,
    url: str | None = None,
    model: str | None = None,
    ignore_eos: str = "auto",
    seeds: bool = True,
    ceiling: CeilingResult | None = None,
    server_pid: int | None = None,
    label: str = "http",
    executor_factory=None,
    out: Printer = _print,
) -> dict:
    """``url`` None: our server in-process on ``cfg``; else any OpenAI-compatible server."""
    if url is None:
        result = trio.run(
            lambda: bench_own_server(
                cfg, workload, ignore_eos=ignore_eos, seeds=seeds, executor_factory=executor_factory
            )
        )
    else:
        result = trio.run(
            lambda: bench_url(url, workload, model=model, ignore_eos=ignore_eos, label=label, seeds=seeds)
        )
    for row in result["rows"]:
        add_ratio(row, ceiling.reference(row["conc"]) if ceiling else None)
    machine = machine_info(server_pid=server_pid)
    section = {"kind": "http", "machine": machine, **result}
    text = format_section(f"HTTP streaming ({result['url']})", result["rows"], machine, http_notes(result))
    out(text + (format_seeds(result["seeds"]) + "\n" if result["seeds"] else ""))
    return section


def run_all(cfg: EngineConfig, workload, models: Sequence[str], out: Printer = _print) -> dict:
    """For each model: ceiling, engine (simple and batched), our HTTP server (batched)."""
    sections = []
    for model in models:
        model_cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, path=model))
        ceiling, section = ceiling_section(model_cfg, workload, out)
        sections.append(section)
        sections.append(engine_section(model_cfg, workload, ceiling, out=out))
        sections.append(http_section(model_cfg, workload, ceiling=ceiling, out=out))
    return {"command": " ".join(sys.argv), "workload": attrs.asdict(workload), "sections": sections}


def resolve_model_dir(path: str, cfg: EngineConfig) -> str:
    """A local directory for ``demo:<size>`` (built once, cached), else ``path`` unchanged."""
    from ..worker.demo import is_demo_path, resolve_demo_model

    return str(resolve_demo_model(path, cfg.model.demo_cache_dir)) if is_demo_path(path) else path


def peer_bench(cfg: EngineConfig, workload, *, ignore_eos: str = "auto", seeds: bool = True, out: Printer = _print):
    """The benchmark ``run_peers`` runs against each started server."""

    def bench(base_url: str, model: str | None, pid: int, name: str) -> dict:
        return http_section(
            cfg,
            workload,
            url=base_url,
            model=model,
            ignore_eos=ignore_eos,
            seeds=seeds,
            server_pid=pid,
            label=name,
            out=out,
        )

    return bench


def print_peers(results: Sequence[dict], out: Printer = _print) -> None:
    """One summary table over the peers: per level, the main figures, start-up time, peak RSS and
    the seeds workload's speedup (all five at once over one at a time)."""
    rows = []
    for r in results:
        if "error" in r:
            rows.append({"path": r["peer"], "error": r["error"]})
            continue
        speedup = r["seeds"]["speedup"] if r.get("seeds") else None
        for row in r["rows"]:
            picked = {k: row.get(k) for k in _PEER_COLUMNS}
            rows.append({"path": r["peer"], **picked, "ready_s": r["ready_s"], "seeds_speedup": speedup})
    columns = ["path", *_PEER_COLUMNS, "ready_s", "seeds_speedup", "error"]
    present = [c for c in columns if any(c in row for row in rows)]
    out("== peers summary\n" + format_table(rows, present) + "\n")
    for r in results:
        if "error" in r:
            out(f"{r['peer']}: {r['error']}\n  command: {' '.join(r['argv'])}\n{r.get('log_tail', '')}")


_PEER_COLUMNS = (
    "conc",
    "tok_per_req",
    "agg_tok_s",
    "req_tok_s",
    "ttft_p50_ms",
    "itl_p50_ms",
    "count_from",
    "peak_rss_mib",
)
