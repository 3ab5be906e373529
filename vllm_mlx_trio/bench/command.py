"""The ``vllm-mlx-trio bench ...`` subcommands: their arguments, and each one's handler.

``cli.py`` builds the configuration (file, environment, ``--set``, ``--model``) and hands it
to :func:`run_bench`, which calls the handler the chosen subparser carries (``handlers.py``);
only ``bench peers`` and ``bench http --url`` run no model in this process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from . import handlers
from .shared_prefix.command import add_shared_prefix_args
from .workload import parse_levels

ConfigArgs = Callable[[argparse.ArgumentParser], None]
#: Where ``--vllm-mlx`` is looked for when not given (``peers.vllm_mlx_executable``).
VLLM_MLX_HELP = "the vllm-mlx executable (default: $VLLM_MLX_TRIO_BENCH_VLLM_MLX, else vllm-mlx on the PATH)"


def _levels(text: str) -> tuple[int, ...]:
    try:
        return parse_levels(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _levels_or_zero(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"values must be >= 0, got {text!r}")
    return values


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


def _add(sub, config_args: ConfigArgs, name: str, handler: handlers.Handler, text: str) -> argparse.ArgumentParser:
    """A subcommand with the config arguments, run by ``handler(cfg, args)``."""
    parser = sub.add_parser(name, help=text)
    config_args(parser)
    parser.set_defaults(handler=handler)
    return parser


def add_bench_parser(commands, config_args: ConfigArgs) -> None:
    """The ``bench`` command and its subcommands, on the top-level subparsers."""
    bench = commands.add_parser("bench", help="benchmarks that print tables (docs/benchmarks.md)")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    _in_process_args(sub, config_args)
    _beside_load_args(sub, config_args)
    _cache_and_speculative_args(sub, config_args)
    _cache_cost_args(sub, config_args)
    _soak_args(sub, config_args)
    _latency_args(sub, config_args)
    _router_args(sub, config_args)
    _server_args(sub, config_args)
    _agents_args(sub, config_args)


def _agents_args(sub, config_args: ConfigArgs) -> None:
    from .agents.command import add_agents_args

    text = "multi-turn Claude Code, Codex and OpenCode sessions: prefix-cache reuse per turn"
    add_agents_args(_add(sub, config_args, "agents", handlers.agents, text))

    from .mllm.peers_command import add_mllm_peers_args

    text = "image requests against our server and mlx-vlm's own, alternating: TTFT, tok/s, repeated image"
    add_mllm_peers_args(_add(sub, config_args, "mllm-peers", handlers.mllm_peers, text))


def _in_process_args(sub, config_args: ConfigArgs) -> None:
    """Benchmarks that run mlx-lm or our engine in this process."""
    single = _add(
        sub, config_args, "single", handlers.single, "one streamed request at a time: mlx-lm vs engine vs HTTP"
    )
    single.add_argument("--model", default=None, help="model path (default: the config's)")
    single.add_argument("--max-tokens", type=int, default=128)
    single.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    ceiling = _add(
        sub, config_args, "ceiling", handlers.ceiling, "mlx-lm's generate_step and BatchGenerator in-process"
    )
    ceiling.add_argument("--model", default=None, help="model path (default: the config's)")
    _workload_args(ceiling, "1,5")

    engine = _add(sub, config_args, "engine", handlers.engine, "our engine in-process: simple and batched mode")
    engine.add_argument("--model", default=None, help="model path (default: the config's)")
    engine.add_argument("--modes", default="simple,batched", help="engine modes (default simple,batched)")
    engine.add_argument("--no-ceiling", action="store_true", help="skip the ceiling (no vs_ceiling)")
    _workload_args(engine, "1,5,16")

    http = _add(
        sub, config_args, "http", handlers.http, "streaming chat completions against an OpenAI-compatible server"
    )
    http.add_argument("--url", default=None, help="server base URL (default: start ours in-process)")
    http.add_argument("--model", default=None, help="model name to request (default: the server's first)")
    http.add_argument("--no-seeds", action="store_true", help="skip the five-prompt seeds workload")
    _ignore_eos_arg(http)
    _workload_args(http, "1,5,16")

    ttft = _add(sub, config_args, "ttft", handlers.ttft, "time to first token on an idle engine vs mlx-lm's prefill")
    ttft.add_argument("--model", default=None, help="model path (default: the config's)")
    ttft.add_argument("--samples", type=int, default=8, help="samples per path (default 8)")
    ttft.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    models = _add(
        sub, config_args, "models", handlers.models, "[[models]]: TTFT cold, warm, after an eviction; model_steps"
    )
    models.add_argument(
        "--models", default=None, help="two model paths, comma-separated (default: the config's [[models]], else demos)"
    )
    models.add_argument("--samples", type=_positive, default=3, help="warm and reload samples (default 3)")
    models.add_argument("--requests", type=_positive, default=4, help="streams per model at once (default 4)")
    models.add_argument("--max-tokens", type=_positive, default=32, help="tokens per stream (default 32)")
    models.add_argument("--rounds", type=_positive, default=2, help="alternations of the two modes (default 2)")
    models.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _beside_load_args(sub, config_args: ConfigArgs) -> None:
    """In-process benchmarks of streams beside a load: a huge prompt, an image, a grammar."""
    pre = _add(
        sub, config_args, "preprocess", handlers.preprocess, "ITL of 8 streams while a 32k-token prompt is admitted"
    )
    pre.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    pre.add_argument("--prompt-tokens", type=_positive, default=32_768, help="big prompt size (default 32768)")

    mllm = _add(
        sub,
        config_args,
        "mllm",
        handlers.mllm,
        "image request phases; text ITL while a large image prefills, and while a long video arrives",
    )
    mllm.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    mllm.add_argument("--chunk", type=_positive, default=32, help="mllm_prefill_step_size compared (default 32)")

    structured = _add(
        sub,
        config_args,
        "structured",
        handlers.structured,
        "tok/s of a JSON-constrained row and its neighbours in a batch",
    )
    structured.add_argument("--model", default=None, help="model path (default: the config's)")
    structured.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    structured.add_argument("--rows", type=_positive, default=4, help="rows in the batch (default 4)")
    structured.add_argument("--max-tokens", type=_positive, default=64, help="tokens per row (default 64)")

    adapters = _add(
        sub,
        config_args,
        "adapters",
        handlers.adapters,
        "aggregate tok/s of a batch mixing LoRA adapters and base rows, against the base alone",
    )
    adapters.add_argument("--model", default=None, help="model path (default: the config's)")
    adapters.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    adapters.add_argument("--rows", type=_positive, default=6, help="rows in the batch (default 6)")
    adapters.add_argument("--max-tokens", type=_positive, default=64, help="tokens per row (default 64)")


def _cache_and_speculative_args(sub, config_args: ConfigArgs) -> None:
    spec = _add(
        sub,
        config_args,
        "speculative",
        handlers.speculative,
        "tok/s with speculative decoding on vs off, and its acceptance",
    )
    spec.add_argument("--model", default="demo:spec-target", help="target model (default demo:spec-target)")
    spec.add_argument("--draft-model", default="demo:spec-draft", help="draft model (default demo:spec-draft)")
    spec.add_argument("--num-draft-tokens", type=_positive, default=4, help="drafts per round (default 4)")
    spec.add_argument("--levels", type=_levels, default=(1, 2, 4, 8), help="concurrency levels (default 1,2,4,8)")
    spec.add_argument("--runs", type=_positive, default=3, help="runs per setting, alternating (default 3)")
    spec.add_argument("--max-tokens", type=_positive, default=128, help="tokens per request (default 128)")
    spec.add_argument(
        "--sampled-temperature",
        type=float,
        default=0.7,
        help="also a 1-stream row sampled at this temperature (default 0.7; 0: none)",
    )
    spec.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    shared = _add(
        sub,
        config_args,
        "shared-prefix",
        handlers.shared_prefix,
        "rows sharing a system prompt: KV, step time, tok/s and TTFT with the prefix held once in the batch vs not",
    )
    shared.add_argument("--model", default="demo:small", help="model path (default demo:small)")
    add_shared_prefix_args(shared, _levels)

    prefix = _add(
        sub, config_args, "prefix-cache", handlers.prefix_cache, "pass/fail table of prefix-cache hits and misses"
    )
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


def _cache_cost_args(sub, config_args: ConfigArgs) -> None:
    """What parts of the prefix cache cost: the disk tier's writes and reads, state snapshots."""
    disk = _add(sub, config_args, "disk-tier", handlers.disk_tier, "ms per block of the disk tier's spill and load")
    disk.add_argument("--blocks", type=_positive, default=8, help="blocks a run (default 8)")
    disk.add_argument("--runs", type=_positive, default=3, help="runs (default 3)")
    disk.add_argument("--layers", type=_positive, default=32, help="layers of a block (default 32)")
    disk.add_argument("--kv-heads", type=_positive, default=8, help="KV heads (default 8)")
    disk.add_argument("--block-tokens", type=_positive, default=64, help="tokens of a block (default 64)")
    disk.add_argument("--head-dim", type=_positive, default=128, help="head dimension (default 128)")
    disk.add_argument("--dtype", choices=("float16", "bfloat16", "float32"), default="float16")
    disk.add_argument("--dir", default=None, help="where the tier writes (default: the temporary directory)")
    disk.add_argument("--json", dest="json_path", default=None, help="also write the runs here")

    lookup = _add(
        sub, config_args, "prefix-lookup", handlers.prefix_lookup, "ms of a prefix-cache lookup by conversations cached"
    )
    lookup.add_argument(
        "--conversations",
        type=_levels,
        default=(100, 1000, 10000),
        help="conversations cached, one row each (default 100,1000,10000)",
    )
    lookup.add_argument("--lookups", type=_positive, default=200, help="lookups timed a row (default 200)")
    lookup.add_argument("--json", dest="json_path", default=None, help="also write the rows here")

    snaps = _add(
        sub, config_args, "state-snapshots", handlers.state_snapshots, "TTFT and bytes per cache.state_snapshot_blocks"
    )
    snaps.add_argument(
        "--models",
        default="qwen3_next,gemma3_text",
        help="architectures built with random weights (qwen3_next, gemma3_text) or model directories",
    )
    snaps.add_argument(
        "--values", type=_levels_or_zero, default=(0, 1, 4, 16), help="values compared (default 0,1,4,16)"
    )
    snaps.add_argument("--runs", type=_positive, default=3, help="runs, values alternated (default 3)")
    snaps.add_argument("--block-size", type=_positive, default=64, help="cache.block_size (default 64)")
    snaps.add_argument("--system-words", type=_positive, default=700, help="words of the system prompt (default 700)")
    snaps.add_argument("--json", dest="json_path", default=None, help="also write the rows here")


def _soak_args(sub, config_args: ConfigArgs) -> None:
    soak = _add(
        sub, config_args, "soak", handlers.soak, "mixed requests on our server, then a memory/task/fd leak check"
    )
    soak.add_argument("--model", default="demo:tiny", help="model path (default demo:tiny)")
    soak.add_argument("--requests", type=_positive, default=2000, help="requests in the soak (default 2000)")
    soak.add_argument("--concurrency", type=_positive, default=16, help="clients at once (default 16)")
    soak.add_argument("--max-tokens", type=_positive, default=16, help="tokens per request (default 16)")
    soak.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    soak.add_argument("--warmup", type=int, default=1500, help="mix requests before the baseline (default 1500)")
    soak.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _server_args(sub, config_args: ConfigArgs) -> None:
    """Benchmarks over HTTP against our server and the peers'."""
    every = _add(sub, config_args, "all", handlers.all_models, "ceiling, engine and our HTTP server for each model")
    every.add_argument("--models", default="demo:tiny,demo:small", help="comma-separated model paths")
    _workload_args(every, "1,5,16")

    peers = _add(
        sub, config_args, "peers", handlers.peers, "bench http against ours, mlx_lm.server and vllm-mlx in turn"
    )
    peers.add_argument("--model-dir", default="demo:small", help="model directory (or demo:<size>)")
    peers.add_argument("--peers", default="ours,mlx-lm,vllm-mlx", help="which servers, in order")
    peers.add_argument("--vllm-mlx", default=None, help=VLLM_MLX_HELP)
    peers.add_argument("--port", type=int, default=8701, help="first port; each peer takes the next")
    peers.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for a server")
    peers.add_argument("--no-seeds", action="store_true", help="skip the five-prompt seeds workload")
    _ignore_eos_arg(peers)
    _workload_args(peers, "1,5")


def _intervals(text: str) -> tuple[int, ...]:
    """``bench latency --intervals 1,4``: stream intervals, each >= 1, repeats dropped."""
    try:
        values = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"stream intervals must be >= 1, got {text!r}")
    return values


def _latency_args(sub, config_args: ConfigArgs) -> None:
    lat = _add(
        sub,
        config_args,
        "latency",
        handlers.latency,
        "TTFT and ITL at 1, 5, 16 streams: ours vs mlx_lm.server and vllm-mlx",
    )
    lat.add_argument("--model-dir", default="demo:tiny", help="model directory (or demo:<size>; default demo:tiny)")
    lat.add_argument(
        "--peers",
        default="ours,mlx-lm,vllm-mlx",
        help="servers (default all three); ceiling: mlx-lm's own loops (generate_step at 1 stream, "
        "BatchGenerator above)",
    )
    lat.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME[@CHECKOUT]:KEY=VALUE[,KEY=VALUE]",
        help="also our server with these --set settings (run from CHECKOUT), named NAME",
    )
    lat.add_argument("--vllm-mlx", default=None, help=VLLM_MLX_HELP)
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
    lat.add_argument(
        "--intervals",
        type=_intervals,
        default=None,
        metavar="N[,N...]",
        help="one row per stream_interval for each of our servers, sent in the requests (default: none sent)",
    )
    lat.add_argument("--port", type=int, default=8711, help="first port; each server takes the next")
    lat.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for the servers")
    lat.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def _router_args(sub, config_args: ConfigArgs) -> None:
    from .router import DEFAULT_TARGETS, TARGETS

    router = _add(
        sub, config_args, "router", handlers.router, "replicas behind vllm-router and 2-rank sharding vs one process"
    )
    router.add_argument("--model-dir", default="demo:tiny", help="model directory (or demo:<size>; default demo:tiny)")
    router.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help=f"some of {','.join(TARGETS)}")
    router.add_argument("--rounds", type=_positive, default=3, help="alternated rounds (default 3)")
    router.add_argument("--policy", default="round_robin", help="vllm-router policy for router-2")
    router.add_argument("--port", type=int, default=8731, help="first port to try")
    router.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for a server")
    _workload_args(router, "1,8")


def run_bench(cfg, args: argparse.Namespace) -> int:
    """Run the chosen ``bench`` subcommand (its parser's ``handler``); its exit status."""
    return args.handler(cfg, args)
