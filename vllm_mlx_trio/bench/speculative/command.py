"""``vllm-mlx-trio bench speculative``: run :func:`measure_speculative` and print its table."""

from __future__ import annotations

import argparse


def run_speculative_command(cfg, args: argparse.Namespace) -> int:
    import trio

    from ..machine import format_machine, machine_info
    from ..report import format_table, write_json
    from .run import measure_speculative

    rows = trio.run(
        lambda: measure_speculative(
            cfg,
            draft_model=args.draft_model,
            num_draft_tokens=args.num_draft_tokens,
            runs=args.runs,
            max_tokens=args.max_tokens,
            levels=args.levels,
            sampled_temperature=args.sampled_temperature,
        )
    )
    drafter = "the model's MTP head" if cfg.speculative.method == "mtp" else f"draft {args.draft_model}"
    notes = [
        f"target {cfg.model.path}, {drafter}, num_draft_tokens {args.num_draft_tokens}; greedy "
        f"(temperature 0) unless the row names a temperature (unseeded: rejection sampling), {args.max_tokens} "
        "tokens per request, the streams started together",
        "tok/s: all streams' tokens over the run's wall time; median (min-max) of the runs, off and on alternating; "
        "paired_speedup: each on-run over the off-run just before it; cpu_ms_tok: this process's CPU time per token "
        "(steady under other processes' load); cpu_speedup: off over on",
        "ttft_ms: median time to first token (the prompt's prefill, the same work on and off); decode_speedup: "
        "each on-run's decode rate (tokens after the first over first-to-last token time, per stream, summed) over "
        "the off-run's just before it; the in-process engine, no HTTP",
        "acceptance: accepted / proposed draft tokens; tokens_per_round: accepted + 1 per verify round; "
        "identical: the outputs on and off are the same tokens ('-' for a sampled row: its draws differ)",
    ]
    print(
        "\n".join(
            [
                "== speculative decoding (draft model) on vs off",
                format_machine(machine_info()),
                format_table(rows, list(rows[0])),
            ]
            + [f"note: {n}" for n in notes]
        ),
        flush=True,
    )
    if args.json_path:
        write_json(args.json_path, {"model": cfg.model.path, "draft_model": args.draft_model, "rows": rows})
    return 0
