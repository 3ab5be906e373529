"""Continuous batching under load: N requests one at a time, then all N at once.

    python examples/load_batching.py [CONFIG] [--requests 4] [--max-tokens 16] [--set SECTION.KEY=VALUE]

The engine runs in-process (no server). Without CONFIG it uses the built-in defaults: the
demo:tiny model, batched mode. Every request generates exactly --max-tokens tokens
(``ignore_eos``), greedily, from its own prompt. The script prints the aggregate tokens per
second of each run and the ratio: in batched mode the N concurrent requests share every model
step, so "all at once" is faster; with ``--set engine.mode=simple`` they queue behind each other
and there is no speedup. ``vllm-mlx-trio bench engine`` is the full benchmark (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import time

import trio

from vllm_mlx_trio import SamplingParams, load_config, open_engine


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", help="TOML file (default: built-in defaults, demo:tiny)")
    parser.add_argument("--requests", type=int, default=4, help="requests per run (default 4)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per request (default 16)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one option (repeatable), as with vllm-mlx-trio serve",
    )
    args = parser.parse_args(argv)
    if args.requests < 1 or args.max_tokens < 1:
        parser.error("--requests and --max-tokens must be at least 1")
    return args


async def one_request(engine, i: int, max_tokens: int) -> int:
    """Run request ``i`` to the end; return how many tokens it generated."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    async with engine.open_request([{"role": "user", "content": f"Story {i}, please."}], params) as stream:
        async for _delta in stream:
            pass
        return stream.usage.completion_tokens


async def one_at_a_time(engine, num_requests: int, max_tokens: int) -> int:
    return sum([await one_request(engine, i, max_tokens) for i in range(num_requests)])


async def all_at_once(engine, num_requests: int, max_tokens: int) -> int:
    counts: list[int] = []

    async def run(i: int) -> None:
        counts.append(await one_request(engine, i, max_tokens))

    async with trio.open_nursery() as nursery:
        for i in range(num_requests):
            nursery.start_soon(run, i)
    return sum(counts)


async def run(args: argparse.Namespace) -> dict[str, float]:
    cfg = load_config(args.config, overrides=args.overrides)
    running = cfg.engine.max_num_seqs if cfg.engine.mode == "batched" else 1
    if args.requests > cfg.limits.max_waiting + running:  # the rest would get QueueFullError
        raise SystemExit(
            f"--requests {args.requests} is more than the engine admits at once "
            f"({cfg.limits.max_waiting + running}): raise limits.max_waiting with --set"
        )
    async with open_engine(cfg) as engine:
        print(
            f"model {cfg.model.path}, engine.mode={cfg.engine.mode}, "
            f"max_num_seqs={cfg.engine.max_num_seqs}: {args.requests} requests x {args.max_tokens} tokens"
        )
        await one_request(engine, -1, 2)  # warm-up: the first step compiles and allocates
        rates = {}
        for name, label, load in (
            ("sequential", "one at a time", one_at_a_time),
            ("concurrent", "all at once", all_at_once),
        ):
            start = time.perf_counter()
            tokens = await load(engine, args.requests, args.max_tokens)
            elapsed = time.perf_counter() - start
            rates[name] = tokens / elapsed
            print(f"{label:>13}: {tokens} tokens in {elapsed:.2f} s = {rates[name]:.1f} tok/s")
    rates["speedup"] = rates["concurrent"] / rates["sequential"]
    print(f"speedup: {rates['speedup']:.2f}x (all at once vs one at a time)")
    return rates


def main(argv: list[str] | None = None) -> dict[str, float]:
    return trio.run(run, parse_args(argv))


if __name__ == "__main__":
    main()
