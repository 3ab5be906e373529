"""What each ``vllm-mlx-trio bench ...`` subcommand runs: ``handler(cfg, args) -> exit status``.

``command.py`` sets each subparser's handler (``set_defaults(handler=...)``). A room with a
command module of its own (latency, mllm, soak, speculative, ...) is imported only when its
subcommand runs, so the ``vllm-mlx-trio`` command starts without them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .workload import Workload

Handler = Callable[..., int]


def workload_from(args: argparse.Namespace) -> Workload:
    return Workload(max_tokens=args.max_tokens, concurrency=args.concurrency, min_requests=args.requests)


def with_workload(section: Callable[..., dict]) -> Handler:
    """A handler that runs ``section(cfg, args, workload)`` and writes its payload to ``--json``."""

    def handler(cfg, args: argparse.Namespace) -> int:
        from .report import write_json

        payload = section(cfg, args, workload_from(args))
        if args.json_path:
            write_json(args.json_path, payload)
        return 0

    return handler


def mllm(cfg, args: argparse.Namespace) -> int:
    from .mllm.command import run_mllm_command

    return run_mllm_command(cfg, args)


def mllm_peers(cfg, args: argparse.Namespace) -> int:
    from .mllm.peers_command import run_mllm_peers_command

    return run_mllm_peers_command(cfg, args)


def agents(cfg, args: argparse.Namespace) -> int:
    from .agents.command import run_agents_command

    return run_agents_command(cfg, args)


def speculative(cfg, args: argparse.Namespace) -> int:
    from .speculative.command import run_speculative_command

    return run_speculative_command(cfg, args)


def shared_prefix(cfg, args: argparse.Namespace) -> int:
    from .shared_prefix.command import run_shared_prefix_command

    return run_shared_prefix_command(cfg, args)


def soak(cfg, args: argparse.Namespace) -> int:
    from .soak.run import run_soak_command

    return run_soak_command(cfg, args)


def latency(cfg, args: argparse.Namespace) -> int:
    from .latency.command import run_latency_command

    return run_latency_command(cfg, args)


def disk_tier(cfg, args: argparse.Namespace) -> int:
    from .disk_tier import run_disk_tier_command

    return run_disk_tier_command(cfg, args)


def prefix_lookup(cfg, args: argparse.Namespace) -> int:
    from .prefix_lookup import run_prefix_lookup_command

    return run_prefix_lookup_command(cfg, args)


def state_snapshots(cfg, args: argparse.Namespace) -> int:
    from .state_snapshots import run_state_snapshots_command

    return run_state_snapshots_command(cfg, args)


def prefix_cache(cfg, args: argparse.Namespace) -> int:
    from .prefix_cache.run import run_prefix_cache_bench

    variants = dict(text.split("@", 1) for text in args.variant)
    return run_prefix_cache_bench(
        cfg,
        disabled_run=not args.no_disabled,
        mlx_lm=args.mlx_lm,
        only_mlx_lm=args.only_mlx_lm,
        runs=args.runs,
        variants=variants,
        port=args.port,
    )


@with_workload
def router(cfg, args, workload: Workload) -> dict:
    from .router import RouterBenchArgs, run_router_bench
    from .suite import resolve_model_dir

    bench_args = RouterBenchArgs(
        model_dir=resolve_model_dir(args.model_dir, cfg),
        targets=tuple(args.targets.split(",")),
        rounds=args.rounds,
        policy=args.policy,
        port=args.port,
        startup_timeout_s=args.startup_timeout,
    )
    return run_router_bench(bench_args, workload)


@with_workload
def ceiling(cfg, args, workload: Workload) -> dict:
    from .suite import ceiling_section

    _result, section = ceiling_section(cfg, workload)
    return {"sections": [section]}


@with_workload
def engine(cfg, args, workload: Workload) -> dict:
    from .suite import ceiling_section, engine_section

    sections, ceiling = [], None
    if not args.no_ceiling:
        ceiling, section = ceiling_section(cfg, workload)
        sections.append(section)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    sections.append(engine_section(cfg, workload, ceiling, modes=modes))
    return {"sections": sections}


@with_workload
def http(cfg, args, workload: Workload) -> dict:
    from .suite import http_section

    section = http_section(
        cfg,
        workload,
        url=args.url,
        model=args.model if args.url else None,
        ignore_eos=args.ignore_eos,
        seeds=not args.no_seeds,
    )
    return {"sections": [section]}


@with_workload
def all_models(cfg, args, workload: Workload) -> dict:
    from .suite import run_all

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    return run_all(cfg, workload, models)


@with_workload
def peers(cfg, args, workload: Workload) -> dict:
    from .peers import run_peers, vllm_mlx_executable
    from .suite import peer_bench, print_peers, resolve_model_dir

    model_dir = resolve_model_dir(args.model_dir, cfg)
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    bench = peer_bench(cfg, workload, ignore_eos=args.ignore_eos, seeds=not args.no_seeds)
    results = run_peers(
        names,
        model_dir,
        bench,
        port=args.port,
        vllm_mlx=vllm_mlx_executable(args.vllm_mlx),
        startup_timeout_s=args.startup_timeout,
    )
    print_peers(results)
    return {"model_dir": model_dir, "peers": results}


def single(cfg, args: argparse.Namespace) -> int:
    import json
    import platform

    from .single import format_table, run_single

    rows = run_single(cfg, max_tokens=args.max_tokens)
    print(
        f"model {cfg.model.path}, greedy, max_tokens {args.max_tokens}, {platform.machine()} "
        f"{platform.system()}, medians over the prompts"
    )
    print(format_table(rows))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"model": cfg.model.path, "max_tokens": args.max_tokens, "rows": rows}, f, indent=2)
    return 0


def ttft(cfg, args: argparse.Namespace) -> int:
    import trio

    from .machine import machine_info
    from .report import format_section, write_json
    from .ttft import measure_ttft, ttft_rows

    rows = ttft_rows(trio.run(measure_ttft, cfg, args.samples))
    machine = machine_info()
    notes = [f"model {cfg.model.path}, one prompt at a time on an idle engine, interleaved samples, medians"]
    print(format_section("time to first token, idle", rows, machine, notes), flush=True)
    if args.json_path:
        write_json(args.json_path, {"kind": "ttft", "model": cfg.model.path, "machine": machine, "rows": rows})
    return 0


def models(cfg, args: argparse.Namespace) -> int:
    from .machine import machine_info
    from .models import run
    from .report import format_machine, format_table, write_json

    def format_section(title: str, rows: list[dict], machine: dict, notes: list[str]) -> str:
        parts = [f"== {title}", format_machine(machine), format_table(rows, list(rows[0]))]
        return "\n".join([*parts, *(f"note: {n}" for n in notes)]) + "\n"

    payload = run(cfg, args)
    machine = machine_info()
    a, b = payload["models"][:2]
    sizes = ", ".join(f"{name} {mb} MiB" for name, mb in payload["memory_mb"].items())
    notes = [
        f"models a={a} b={b} ({sizes}, weights plus KV budgets); a streamed chat request, max_tokens 1",
        "after eviction: a budget that holds one model; a request for b unloaded a, then a loads again",
    ]
    print(format_section("[[models]]: time to first token of model a", payload["ttft"], machine, notes), flush=True)
    notes = [f"both models loaded, {args.requests} streams per model at once, max_tokens {args.max_tokens}, medians"]
    print(format_section("[[models]]: two loaded models, server.model_steps", payload["steps"], machine, notes))
    if args.json_path:
        write_json(args.json_path, {**payload, "machine": machine})
    return 0


def preprocess(cfg, args: argparse.Namespace) -> int:
    import trio

    from .machine import format_machine, machine_info
    from .preprocess import NUM_STREAMS, measure_preprocess
    from .report import format_table

    rows = trio.run(measure_preprocess, cfg, args.runs, args.prompt_tokens)
    notes = [
        f"model {cfg.model.path}; {NUM_STREAMS} greedy streams; ~{args.prompt_tokens} prompt tokens once per run",
        "window_s: from the big submit to its answer; itl over that window; median (min-max) of the runs",
    ]
    title = "== streams while a huge prompt is admitted"
    lines = [title, format_machine(machine_info()), format_table(rows, list(rows[0]))]
    print("\n".join(lines + [f"note: {n}" for n in notes]), flush=True)
    return 0


def structured(cfg, args: argparse.Namespace) -> int:
    import trio

    from .machine import format_machine, machine_info
    from .report import format_table
    from .structured import measure_structured

    rows = trio.run(lambda: measure_structured(cfg, args.runs, rows=args.rows, max_tokens=args.max_tokens))
    notes = [
        f"model {cfg.model.path}, batched; {args.rows} greedy rows of {args.max_tokens} tokens, row 0 json_object "
        "in the constrained setting",
        "tok/s per row after its first delta; median (min-max) of the runs; *_ratio: to the unconstrained median; "
        "paired_*: each run against the unconstrained run just before it",
    ]
    table = format_table(rows, list(rows[0]))
    lines = ["== structured output in a shared batch", format_machine(machine_info()), table]
    print("\n".join(lines + [f"note: {n}" for n in notes]), flush=True)
    return 0


def adapters(cfg, args: argparse.Namespace) -> int:
    import trio

    from .adapters import measure_adapters, with_adapters
    from .machine import format_machine, machine_info
    from .report import format_table

    rows = trio.run(lambda: measure_adapters(cfg, args.runs, rows=args.rows, max_tokens=args.max_tokens))
    names = ", ".join(f"{name} = {path}" for name, path in with_adapters(cfg).model.adapters)
    notes = [
        f"model {cfg.model.path}, batched, adapters {names}; {args.rows} greedy rows of {args.max_tokens} tokens",
        "mixed: rows cycle over the base and every adapter, in one batch; agg_tok_s: the batch's tokens over its "
        "wall time, median (min-max) of the runs; ratio: to the base's median; paired: each run against the base "
        "run just before it",
    ]
    table = format_table(rows, list(rows[0]))
    lines = ["== LoRA adapters in a shared batch", format_machine(machine_info()), table]
    print("\n".join(lines + [f"note: {n}" for n in notes]), flush=True)
    return 0
