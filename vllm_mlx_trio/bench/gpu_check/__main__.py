"""``python -m vllm_mlx_trio.bench.gpu_check {device,build,summary}``: the steps of
``scripts/bench_gpu.sh`` that are not ``vllm-mlx-trio bench all`` itself."""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

PROG = "python -m vllm_mlx_trio.bench.gpu_check"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    device = sub.add_parser("device", help="print MLX's default device; exit 1 unless it is --expect")
    device.add_argument("--expect", choices=("gpu", "cpu"), default=None, help="the device the run needs")
    device.set_defaults(run=_device)

    build = sub.add_parser("build", help="build (or reuse) the check's models; print their directories")
    build.add_argument("--dry-run", action="store_true", help="tiny stand-ins (demo:tiny's dimensions)")
    build.add_argument("--models-dir", default=None, help="where (default: bench-gpu beside the demo cache)")
    build.set_defaults(run=_build)

    summary = sub.add_parser("summary", help="one table of vs_ceiling over bench all's JSON files")
    summary.add_argument("json_paths", nargs="+", metavar="JSON", help="files bench all --json wrote")
    summary.set_defaults(run=_summary)
    return parser


def _device(args: argparse.Namespace) -> int:
    from ...worker.ceiling import mlx_device

    device = mlx_device()
    print(f"MLX default device: {device}")
    if args.expect and device != args.expect:
        print(f"{PROG}: MLX runs on {device}, not {args.expect}: is the right mlx backend installed?", file=sys.stderr)
        return 1
    return 0


def _build(args: argparse.Namespace) -> int:
    from ...worker.demo.shaped import build_shaped_model, check_shapes, default_models_dir

    root = pathlib.Path(args.models_dir) if args.models_dir else default_models_dir()
    built = []
    for shape in check_shapes(dry_run=args.dry_run):
        start = time.perf_counter()
        built.append(str(build_shaped_model(root / shape.name, shape)))
        seconds = time.perf_counter() - start
        print(f"{shape.name}: {shape.num_parameters / 1e6:.1f}M parameters, built in {seconds:.1f} s", file=sys.stderr)
    print(",".join(built))
    return 0


def _summary(args: argparse.Namespace) -> int:
    from .summary import format_summary

    text, complete = format_summary(args.json_paths)
    print(text, end="")
    return 0 if complete else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
