"""``vllm-mlx-trio bench latency``: its arguments turned into a run, and the printed table."""

from __future__ import annotations

import argparse
import sys

import attrs

from ..peers import PeerServer, peer_server, vllm_mlx_executable
from .arrival import ArrivalWorkload
from .run import QUICK, LatencyWorkload, missing_executable, ours_variant, run_latency

#: In ``--peers``: mlx-lm's own loops in a child process at every level (not a server):
#: ``generate_step`` at level 1, ``BatchGenerator`` above it.
CEILING = "ceiling"
#: In ``--peers``: the ceiling, and at level 1 also its loop writing every token as its own SSE
#: event to a socket read by this process (``mlx-lm generate_step + SSE``): the least any server
#: that sends every token on its own adds to the loop.
CEILING_SSE = "ceiling-sse"

COLUMNS = (
    "path",
    "conc",
    "reps",
    "reqs",
    "prompt_tok",
    "tok_per_req",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "chunks_per_token",
    "cpu_ms_per_token",
    "loop_cpu_ms_per_token",
    "client_cpu_ms_per_token",
    "agg_tok_s",
    "ttft_vs_best_peer",
    "vs_ceiling",
    "paired_vs_ceiling",
)


ARRIVAL_COLUMNS = (
    "path",
    "reps",
    "outlasted",
    "arrival_gaps",
    "alone_itl_p50_ms",
    "alone_itl_p95_ms",
    "arrival_itl_p50_ms",
    "arrival_itl_p95_ms",
    "arrival_itl_max_ms",
    "p95_over_alone_p50",
    "alone_p95_over_p50",
    "p95_over_alone_p95",
    "long_ttft_ms",
)


def arrival_from_args(args: argparse.Namespace) -> ArrivalWorkload:
    """``--scenario long-arrival``: ``--max-tokens`` is the streams', ``--lengths`` the long prompt's."""
    given = {
        "stream_max_tokens": args.max_tokens,
        "repetitions": args.repetitions,
        "long_tokens": args.lengths[-1] if args.lengths else None,
    }
    return attrs.evolve(ArrivalWorkload(), **{k: v for k, v in given.items() if v is not None})


def _arrival_notes(work: ArrivalWorkload) -> list[str]:
    return [
        f"{work.streams} streams ({work.stream_prompt_tokens}-token fresh prompts, {work.stream_max_tokens} tokens, "
        f"greedy); alone: their gaps after {work.settle} pieces; arrival: once each has {work.settle} pieces a fresh "
        f"{work.long_tokens}-token prompt is sent, their gaps overlapping the time from its sending to its first token",
        "ITL per token: a piece of k tokens (its logprobs entries, else the stream's mean) after a gap g is k gaps "
        "of g/k; arrival_gaps counts tokens; arrival_itl_max_ms: the longest gap between pieces",
        "p95_over_alone_p50: arrival ITL p95 over alone ITL p50, per repetition (target <= 2); it is "
        "alone_p95_over_p50 (the streams' own tail, no long prompt) times p95_over_alone_p95 (what the arrival adds "
        "to it); outlasted: repetitions where every stream still ran at the long prompt's first token; figures: "
        "median (min-max)",
    ]


def workload_from_args(args: argparse.Namespace) -> LatencyWorkload:
    base = QUICK if args.quick else LatencyWorkload()
    given = {
        "levels": args.levels,
        "lengths": args.lengths,
        "max_tokens": args.max_tokens,
        "repetitions": args.repetitions,
        "intervals": args.intervals,
    }
    return attrs.evolve(base, **{k: v for k, v in given.items() if v is not None})


def interval_notes(workload: LatencyWorkload, step: dict | None) -> list[str]:
    """How to read ``chunks_per_token`` and the ITL figures against the raw loop's step."""
    notes = [
        "chunks_per_token: content chunks / completion tokens (1.00: a chunk per token; about 1/N: chunks of N; "
        "none when the server sends no usage); ITL divides each gap by the mean tokens per chunk, 1 / it",
        "cpu_ms_per_token: the process's CPU (all threads, /proc) over its completion tokens, the raw loop's too "
        "(its short warm-up request included); loop_cpu_ms_per_token: our server's main thread, the event loop; "
        "client_cpu_ms_per_token: this process, the client reading the streams (it shares the machine's cores); "
        "CPU time drifts far less with the machine's load than tok/s",
    ]
    if workload.intervals:
        notes.append(
            f"NAME-siN: our server's requests carry stream_interval N ({','.join(map(str, workload.intervals))}), "
            "one server process serving every interval; the peers' rows send none"
        )
    if step is not None:
        notes.append(
            f"step_ms {step['itl_p50_ms']}: the raw loop's per-step time (mlx-lm generate_step's ITL p50 at one "
            f"stream, median; 1000 / its tok/s, prefill included: {step['from_tok_s']} ms); an ITL p50 near it at "
            "chunks_per_token 1.00 is a server keeping the raw loop's pace"
        )
    return notes


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"b64:engine.max_num_batched_tokens=64,engine.prefill_step_size=64"`` -> (name, settings)."""
    name, checkout, settings = parse_checkout_variant(text)
    if checkout is not None:
        raise ValueError(f"--variant takes no @CHECKOUT here, got {text!r}")
    return name, settings


def parse_checkout_variant(text: str) -> tuple[str, str | None, list[str]]:
    """``"base@/tmp/old:"`` -> ("ours-base", "/tmp/old", []): NAME[@CHECKOUT]:[KEY=VALUE,...], our
    server from another checkout of this package (before/after in one run); settings are
    needed without one."""
    head, _, settings = text.partition(":")
    name, _, checkout = head.partition("@")
    pairs = [kv.strip() for kv in settings.split(",") if kv.strip()]
    if not name or not (pairs or checkout):
        raise ValueError(f"--variant wants NAME[@CHECKOUT]:KEY=VALUE[,KEY=VALUE], got {text!r}")
    return f"ours-{name}", checkout or None, pairs


def servers_from_args(args: argparse.Namespace, model_dir: str) -> tuple[list[PeerServer], list[str]]:
    """The servers to start (ports assigned in order) and the notes on those left out."""
    names = [p.strip() for p in args.peers.split(",") if p.strip() and p.strip() not in (CEILING, CEILING_SSE)]
    servers, notes = [], []
    vllm_mlx = vllm_mlx_executable(args.vllm_mlx)
    for name in names:
        servers.append(peer_server(name, model_dir, 0, vllm_mlx=vllm_mlx, scratch="/tmp/bench-latency-home"))
    for text in args.variant:
        label, checkout, settings = parse_checkout_variant(text)
        servers.append(ours_variant(label, settings, model_dir, 0, checkout=checkout))
    kept = []
    for server in servers:
        if missing_executable(server):
            notes.append(f"{server.name} left out: {server.argv[0]} not found")
        else:
            kept.append(server)
    return kept, notes


def _with_port(server: PeerServer, port: int) -> PeerServer:
    """The server's argv with its port: ours takes ``server.port=``, the others ``--port``."""
    argv = list(server.argv)
    for i, arg in enumerate(argv):
        if arg == "server.port=0":
            argv[i] = f"server.port={port}"
        elif arg == "--port":
            argv[i + 1] = str(port)
    return attrs.evolve(server, argv=tuple(argv))


def run_latency_command(cfg, args: argparse.Namespace) -> int:
    from ..machine import format_machine, machine_info
    from ..report import format_table, write_json
    from ..suite import resolve_model_dir
    from .prompts import PromptMaker, chat_token_counter

    arrival = args.scenario == "long-arrival"
    if arrival and args.intervals:
        print("bench latency: --intervals is for --scenario levels", file=sys.stderr)
        return 2
    model_dir = resolve_model_dir(args.model_dir, cfg)
    workload = arrival_from_args(args) if arrival else workload_from_args(args)
    servers, notes = servers_from_args(args, model_dir)
    servers = [_with_port(s, args.port + i) for i, s in enumerate(servers)]
    maker = PromptMaker(chat_token_counter(model_dir))
    peers = {p.strip() for p in args.peers.split(",")}
    with_ceiling = bool(peers & {CEILING, CEILING_SSE})
    ceiling_cfg = attrs.evolve(cfg, model=attrs.evolve(cfg.model, path=model_dir)) if with_ceiling else None
    result = run_latency(
        servers,
        workload,
        maker,
        first_port=args.port,
        startup_timeout_s=args.startup_timeout,
        ceiling_cfg=ceiling_cfg,
        ceiling_streamed=CEILING_SSE in peers,
    )
    notes += (
        _arrival_notes(workload)
        if arrival
        else [
            f"model {args.model_dir}; prompts of {','.join(map(str, workload.lengths))} tokens cycled, fresh each "
            f"(a unique tag first); max_tokens {workload.max_tokens}, greedy; {workload.repetitions} repetitions",
            "each level: max(level, number of lengths) requests from `level` clients (closed loop); servers alternate",
            "figures: median (min-max) over the repetitions; "
            "ttft_vs_best_peer: TTFT p50 over the best non-ours server's",
            *interval_notes(workload, result.get("step_ms")),
        ]
    )
    notes.append(
        f"model {args.model_dir}; client: this process; every server in its own process; peak RSS MiB: "
        + ", ".join(f"{k} {v}" for k, v in result["peak_rss_mib"].items())
    )
    title = "long prompt arriving while streams decode" if arrival else "TTFT and ITL under load"
    print(
        f"== latency: {title}",
        format_machine(machine_info()),
        format_table(result["table"], list(ARRIVAL_COLUMNS if arrival else COLUMNS)),
        *(f"note: {n}" for n in notes),
        sep="\n",
        flush=True,
    )
    if args.json_path:
        write_json(args.json_path, {"kind": "latency", "workload": attrs.asdict(workload), **result, "notes": notes})
    return 0
