"""The ``vllm-mlx-trio bench ...`` subcommands: their arguments and what each runs.

``cli.py`` builds the configuration (file, environment, ``--set``, ``--model``) and hands it
here; only ``bench peers`` and ``bench http --url`` run no model in this process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .workload import Workload, parse_levels

ConfigArgs = Callable[[argparse.ArgumentParser], None]


def _levels(text: str) -> tuple[int, ...]:
    try:
        return parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _workload_args(parser: argparse.ArgumentParser, concurrency: str) -> None:
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request (default 128)")
    parser.add_argument(
        "--concurrency",
        type=_levels,
        default=_levels(concurrency),
        help=f"comma-separated concurrency levels (default {concurrency})",
    )
    parser.add_argument(
        "--requests", type=int, default=3, help="each level runs max(concurrency, this) requests (default 3)"
    )
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _ignore_eos_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ignore-eos",
        choices=("auto", "on", "off"),
        default="auto",
        help="send ignore_eos: auto probes whether the server accepts it",
    )


def add_bench_parser(commands, config_args: ConfigArgs) -> None:
    """The ``bench`` command and its subcommands, on the top-level subparsers."""
    bench = commands.add_parser("bench", help="benchmarks that print tables (docs/benchmarks.md)")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    _in_process_args(sub, config_args)
    _cache_and_speculative_args(sub, config_args)
    _soak_args(sub, config_args)
    _latency_args(sub, config_args)
    _router_args(sub, config_args)
    _server_args(sub, config_args)


def _in_process_args(sub, config_args: ConfigArgs) -> None:
    """Benchmarks that run mlx-lm or our engine in this process."""
    single = sub.add_parser("single", help="one streamed request at a time: mlx-lm vs engine vs HTTP")
    config_args(single)
    single.add_argument("--model", default=None, help="model path (default: the config's)")
    single.add_argument("--max-tokens", type=int, default=128)
    single.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    ceiling = sub.add_parser("ceiling", help="mlx-lm's generate_step and BatchGenerator in-process")
    config_args(ceiling)
    ceiling.add_argument("--model", default=None, help="model path (default: the config's)")
    _workload_args(ceiling, "1,5")

    engine = sub.add_parser("engine", help="our engine in-process: simple and batched mode")
    config_args(engine)
    engine.add_argument("--model", default=None, help="model path (default: the config's)")
    engine.add_argument("--modes", default="simple,batched", help="engine modes (default simple,batched)")
    engine.add_argument("--no-ceiling", action="store_true", help="skip the ceiling (no vs_ceiling)")
    _workload_args(engine, "1,5,16")

    http = sub.add_parser("http", help="streaming chat completions against an OpenAI-compatible server")
    config_args(http)
    http.add_argument("--url", default=None, help="server base URL (default: start ours in-process)")
    http.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    http.add_argument("--no-seeds", action="store_true", help="skip the five-prompt seeds workload")
    _ignore_eos_arg(http)
    _workload_args(http, "1,5,16")

    ttft = sub.add_parser("ttft", help="time to first token on an idle engine vs mlx-lm's prefill")
    config_args(ttft)
    ttft.add_argument("--model", default=None, help="model path (default: the config's)")
    ttft.add_argument("--samples", type=int, default=8, help="samples per path (default 8)")
    ttft.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    pre = sub.add_parser("preprocess", help="ITL of 8 streams while a 32k-token prompt is admitted")
    config_args(pre)
    pre.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    pre.add_argument("--prompt-tokens", type=_positive, default=32_768, help="big prompt size (default 32768)")

    mllm = sub.add_parser("mllm", help="image request phases; text ITL while a large image prefills")
    config_args(mllm)
    mllm.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    mllm.add_argument("--chunk", type=_positive, default=32, help="mllm_prefill_step_size compared (default 32)")

    structured = sub.add_parser("structured", help="tok/s of a JSON-constrained row and its neighbours in a batch")
    config_args(structured)
    structured.add_argument("--model", default=None, help="model path (default: the config's)")
    structured.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    structured.add_argument("--rows", type=_positive, default=4, help="rows in the batch (default 4)")
    structured.add_argument("--max-tokens", type=_positive, default=64, help="tokens per row (default 64)")


def _cache_and_speculative_args(sub, config_args: ConfigArgs) -> None:
    spec = sub.add_parser("speculative", help="tok/s with speculative decoding on vs off, and its acceptance")
    config_args(spec)
    spec.add_argument("--model", default="demo:spec-target", help="target model (default demo:spec-target)")
    spec.add_argument("--draft-model", default="demo:spec-draft", help="draft model (default demo:spec-draft)")
    spec.add_argument("--num-draft-tokens", type=_positive, default=4, help="drafts per round (default 4)")
    spec.add_argument("--levels", type=_levels, default=(1, 5), help="concurrency levels (default 1,5)")
    spec.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    spec.add_argument("--max-tokens", type=_positive, default=128, help="tokens per request (default 128)")
    spec.add_argument(
        "--sampled-temperature",
        type=float,
        default=0.7,
        help="also a 1-stream row sampled at this temperature (default 0.7; 0: none)",
    )
    spec.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    prefix = sub.add_parser("prefix-cache", help="pass/fail table of prefix-cache hits and misses")
    config_args(prefix)
    prefix.add_argument("--model", default=None, help="model path (default: the config's, demo:tiny)")
    prefix.add_argument("--no-disabled", action="store_true", help="skip the run with the cache off")
    prefix.add_argument("--mlx-lm", action="store_true", help="also the 48-token repeat over HTTP vs mlx_lm.server")
    prefix.add_argument("--only-mlx-lm", action="store_true", help="only that comparison (rows 7a-7c)")
    prefix.add_argument("--runs", type=_positive, default=3, help="rounds of that comparison (default 3)")
    prefix.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME@CHECKOUT",
        help="also our server from another checkout, in the same rounds (repeatable)",
    )
    prefix.add_argument("--port", type=_positive, default=8711, help="first port of that comparison (default 8711)")


def _soak_args(sub, config_args: ConfigArgs) -> None:
    soak = sub.add_parser("soak", help="mixed requests on our server, then a memory/task/fd leak check")
    config_args(soak)
    soak.add_argument("--model", default="demo:tiny", help="model path (default demo:tiny)")
    soak.add_argument("--requests", type=_positive, default=2000, help="requests in the soak (default 2000)")
    soak.add_argument("--concurrency", type=_positive, default=16, help="clients at once (default 16)")
    soak.add_argument("--max-tokens", type=_positive, default=16, help="tokens per request (default 16)")
    soak.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    soak.add_argument("--warmup", type=int, default=1500, help="mix requests before the baseline (default 1500)")
    soak.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _server_args(sub, config_args: ConfigArgs) -> None:
    """Benchmarks over HTTP against our server and the peers'."""
    every = sub.add_parser("all", help="ceiling, engine and our HTTP server for each model")
    config_args(every)
    every.add_argument("--models", default="demo:tiny,demo:small", help="comma-separated model paths")
    _workload_args(every, "1,5,16")

    peers = sub.add_parser("peers", help="bench http against ours, mlx_lm.server and vllm-mlx in turn")
    config_args(peers)
    peers.add_argument("--model-dir", default="demo:small", help="model directory (or demo:<size>)")
    peers.add_argument("--peers", default="ours,mlx-lm,vllm-mlx", help="which servers, in order")
    peers.add_argument("--vllm-mlx", default=None, help="the vllm-mlx executable (a separate venv)")
    peers.add_argument("--port", type=int, default=8701, help="first port; each peer takes the next")
    peers.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for a server")
    peers.add_argument("--no-seeds", action="store_true", help="skip the five-prompt seeds workload")
    _ignore_eos_arg(peers)
    _workload_args(peers, "1,5")


def _latency_args(sub, config_args: ConfigArgs) -> None:
    lat = sub.add_parser("latency", help="TTFT and ITL at 1, 5, 16 streams: ours vs mlx_lm.server and vllm-mlx")
    config_args(lat)
    lat.add_argument("--model-dir", default="demo:tiny", help="model directory (or demo:<size>; default demo:tiny)")
    lat.add_argument(
        "--peers", default="ours,mlx-lm,vllm-mlx", help="servers (default all three); ceiling: mlx-lm generate_step"
    )
    lat.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[@CHECKOUT]:KEY=VALUE[,KEY=VALUE]",
        help="also our server with these --set settings (run from CHECKOUT), named NAME",
    )
    lat.add_argument("--vllm-mlx", default=None, help="the vllm-mlx executable (a separate venv)")
    lat.add_argument(
        "--scenario",
        choices=("levels", "long-arrival"),
        default="levels",
        help="levels: 1/5/16 streams; long-arrival: a 2000-token prompt while 4 decode",
    )
    lat.add_argument("--quick", action="store_true", help="levels 1,5; lengths 50,500; 16 tokens; 2 repetitions")
    lat.add_argument("--levels", type=_levels, default=None, help="concurrency levels (default 1,5,16)")
    lat.add_argument("--lengths", type=_levels, default=None, help="prompt tokens, cycled (default 50,500,2000)")
    lat.add_argument("--max-tokens", type=_positive, default=None, help="tokens per request (default 32)")
    lat.add_argument("--repetitions", type=_positive, default=None, help="repetitions (default 3)")
    lat.add_argument("--port", type=int, default=8711, help="first port; each server takes the next")
    lat.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for the servers")
    lat.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _router_args(sub, config_args: ConfigArgs) -> None:
    from .router import DEFAULT_TARGETS, TARGETS

    router = sub.add_parser("router", help="replicas behind vllm-router and 2-rank sharding vs one process")
    config_args(router)
    router.add_argument("--model-dir", default="demo:tiny", help="model directory (or demo:<size>; default demo:tiny)")
    router.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help=f"some of {','.join(TARGETS)}")
    router.add_argument("--rounds", type=_positive, default=3, help="alternated rounds (default 3)")
    router.add_argument("--policy", default="round_robin", help="vllm-router policy for router-2")
    router.add_argument("--port", type=int, default=8731, help="first port to try")
    router.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for a server")
    _workload_args(router, "1,8")


def workload_from(args: argparse.Namespace) -> Workload:
    return Workload(max_tokens=args.max_tokens, concurrency=args.concurrency, min_requests=args.requests)


def run_bench(cfg, args: argparse.Namespace) -> int:
    """Run the chosen ``bench`` subcommand; write ``--json`` when given."""
    from .report import write_json

    if args.bench_command == "single":
        return _single(cfg, args)
    if args.bench_command == "ttft":
        return _ttft(cfg, args)
    if args.bench_command == "preprocess":
        return _preprocess(cfg, args)
    if args.bench_command == "structured":
        return _structured(cfg, args)
    if args.bench_command == "mllm":
        from .mllm.command import run_mllm_command

        return run_mllm_command(cfg, args)
    if args.bench_command == "speculative":
        from .speculative.command import run_speculative_command

        return run_speculative_command(cfg, args)
    if args.bench_command == "soak":
        from .soak.run import run_soak_command

        return run_soak_command(cfg, args)
    if args.bench_command == "latency":
        from .latency.command import run_latency_command

        return run_latency_command(cfg, args)
    if args.bench_command == "router":
        return _router(cfg, args)
    if args.bench_command == "prefix-cache":
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
    handlers = {"ceiling": _ceiling, "engine": _engine, "http": _http, "all": _all, "peers": _peers}
    payload = handlers[args.bench_command](cfg, args, workload_from(args))
    if args.json_path:
        write_json(args.json_path, payload)
    return 0


def _router(cfg, args: argparse.Namespace) -> int:
    from .report import write_json
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
    payload = run_router_bench(bench_args, workload_from(args))
    if args.json_path:
        write_json(args.json_path, payload)
    return 0


def _ceiling(cfg, args, workload: Workload) -> dict:
    from .suite import ceiling_section

    _result, section = ceiling_section(cfg, workload)
    return {"sections": [section]}


def _engine(cfg, args, workload: Workload) -> dict:
    from .suite import ceiling_section, engine_section

    sections, ceiling = [], None
    if not args.no_ceiling:
        ceiling, section = ceiling_section(cfg, workload)
        sections.append(section)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    sections.append(engine_section(cfg, workload, ceiling, modes=modes))
    return {"sections": sections}


def _http(cfg, args, workload: Workload) -> dict:
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


def _all(cfg, args, workload: Workload) -> dict:
    from .suite import run_all

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    return run_all(cfg, workload, models)


def _peers(cfg, args, workload: Workload) -> dict:
    from .peers import DEFAULT_VLLM_MLX, run_peers
    from .suite import peer_bench, print_peers, resolve_model_dir

    model_dir = resolve_model_dir(args.model_dir, cfg)
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    bench = peer_bench(cfg, workload, ignore_eos=args.ignore_eos, seeds=not args.no_seeds)
    results = run_peers(
        names,
        model_dir,
        bench,
        port=args.port,
        vllm_mlx=args.vllm_mlx or DEFAULT_VLLM_MLX,
        startup_timeout_s=args.startup_timeout,
    )
    print_peers(results)
    return {"model_dir": model_dir, "peers": results}


def _single(cfg, args: argparse.Namespace) -> int:
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


def _ttft(cfg, args: argparse.Namespace) -> int:
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


def _preprocess(cfg, args: argparse.Namespace) -> int:
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


def _structured(cfg, args: argparse.Namespace) -> int:
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
