"""Plain-text tables and the JSON file every ``bench`` command can write."""

from __future__ import annotations

import json
from collections.abc import Sequence

from .machine import format_machine

#: Column order of the throughput tables; columns a row lacks are left out.
COLUMNS = (
    "path",
    "conc",
    "reqs",
    "tok_per_req",
    "prompt_tok",
    "agg_tok_s",
    "req_tok_s",
    "samples",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "ttft_max_ms",
    "vs_ceiling_ms",
    "itl_p50_ms",
    "itl_p95_ms",
    "vs_ceiling",
    "count_from",
    "peak_rss_mib",
)


def _cell(value) -> str:
    return "-" if value is None else str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str] | None = None) -> str:
    """A ``|``-separated table; columns default to :data:`COLUMNS` present in any row."""
    if not rows:
        return "(no rows)"
    if columns is None:
        present = {key for row in rows for key in row}
        columns = [c for c in COLUMNS if c in present] or list(rows[0])
    widths = {c: max(len(c), *(len(_cell(r.get(c))) for r in rows)) for c in columns}
    lines = [" | ".join(c.ljust(widths[c]) for c in columns)]
    lines.append("-+-".join("-" * widths[c] for c in columns))
    lines += [" | ".join(_cell(r.get(c)).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def format_section(title: str, rows: Sequence[dict], machine: dict, notes: Sequence[str] = ()) -> str:
    """A titled table with the machine and BLAS lines above it and notes below."""
    parts = [f"== {title}", format_machine(machine), format_table(rows)]
    parts += [f"note: {n}" for n in notes]
    return "\n".join(parts) + "\n"


def format_seeds(seeds: dict) -> str:
    """The seeds workload: one at a time vs all at once, and the speedup."""
    rows = [seeds["sequential"], seeds["concurrent"]]
    columns = ["path", "conc", "reqs", "tok_per_req", "agg_tok_s", "ttft_p50_ms", "itl_p50_ms", "count_from"]
    return "\n".join(
        [
            f"seeds workload ({len(seeds['prompts'])} prompts, max_tokens {seeds['max_tokens']}): "
            f"all at once vs one at a time: speedup {_cell(seeds['speedup'])}x",
            format_table(rows, [c for c in columns if any(c in r for r in rows)]),
            "note: completion tokens only are counted (vllm-mlx's own table counts prompt tokens too);",
            "note: the seed prompts repeat (warm-up, then each run), so a prefix cache may shorten TTFT",
        ]
    )


def write_json(path: str, payload: dict) -> None:
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
        f.write("\n")
