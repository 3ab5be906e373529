"""``vllm-mlx-trio bench shared-prefix``: run :func:`measure_shared_prefix` and print its table."""

from __future__ import annotations

import argparse


def add_shared_prefix_args(parser: argparse.ArgumentParser, levels) -> None:
    parser.add_argument("--rows", type=levels, default=None, help="comma-separated row counts (default 1,4,8,16)")
    parser.add_argument(
        "--prefix-tokens",
        type=levels,
        default=None,
        help="comma-separated system prompt lengths (default 512,2048,8192)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per setting, off and on alternating (default 3)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the results here")


def run_shared_prefix_command(cfg, args: argparse.Namespace) -> int:
    import trio

    from ..machine import format_machine, machine_info
    from ..report import format_table, write_json
    from .run import DEFAULT_PREFIX_TOKENS, DEFAULT_ROWS, measure_shared_prefix

    rows, notes = trio.run(
        lambda: measure_shared_prefix(
            cfg,
            rows=args.rows or DEFAULT_ROWS,
            prefix_tokens=args.prefix_tokens or DEFAULT_PREFIX_TOKENS,
            runs=args.runs,
            max_tokens=args.max_tokens,
        )
    )
    notes = [
        f"model {cfg.model.path}; N greedy requests with one system prompt of about P tokens (already in the prefix "
        f"cache) and distinct questions, started together, {args.max_tokens} tokens each; "
        "cache.share_prefix_in_batch false (off) and true (on), two engines side by side, alternating",
        "kv_mib: the most bytes the running batch's KV layers held (measured after each step); step_ms: median over "
        "the streams of their time between tokens; tok_s: all tokens over the run's wall time; ttft_ms: median "
        f"time to first token; medians of {args.runs} runs; ratios on / off; identical: the same tokens on and off",
        *notes,
    ]
    if not rows:
        print("\n".join(f"note: {n}" for n in notes), flush=True)
        return 1
    print(
        "\n".join(
            [
                "== shared prefix in the batch: on vs off",
                format_machine(machine_info()),
                format_table(rows, list(rows[0])),
            ]
            + [f"note: {n}" for n in notes]
        ),
        flush=True,
    )
    if args.json_path:
        write_json(args.json_path, {"model": cfg.model.path, "rows": rows, "notes": notes})
    return 0
