"""``vllm-mlx-trio bench disk-tier``: what the prefix cache's disk tier costs per block.

The measurement is ``worker/prefix/disk_tier_cost.py``'s, on random blocks of the given shape
(by default the 64-token block of a 32-layer, 8-KV-head, head-dim-128 float16 model: 8 MiB):
the spill on the MLX thread, the spill until the writer thread has written it, and a load
back from its file. Each row gives the median of the runs and their range, in ms per block.
"""

from __future__ import annotations

import argparse

import attrs

from .stats import median_spread

#: Each phase's row name: what the time covers.
PHASE_NAMES = {
    "spill_ms": "spill (MLX thread)",
    "written_ms": "spill until written (writer thread)",
    "load_ms": "load (read, check, to MLX)",
}


def disk_tier_rows(runs: list[dict[str, float]]) -> list[dict]:
    """One row per phase: ms per block, median (min-max) of the runs."""
    return [
        {"phase": name, "ms_per_block": median_spread([run[key] for run in runs]), "runs": len(runs)}
        for key, name in PHASE_NAMES.items()
    ]


def run_disk_tier_command(cfg, args: argparse.Namespace) -> int:
    """Measure, print the table (and the machine), and write ``--json`` when given."""
    from ..worker.prefix.disk_tier_cost import BlockShape, measure_disk_tier
    from .machine import machine_info
    from .report import format_section, write_json

    shape = BlockShape(
        layers=args.layers, kv_heads=args.kv_heads, tokens=args.block_tokens, head_dim=args.head_dim, dtype=args.dtype
    )
    runs = measure_disk_tier(shape, blocks=args.blocks, runs=args.runs, directory=args.dir)
    rows = disk_tier_rows(runs)
    machine = machine_info()
    notes = [
        f"{args.blocks} blocks a run of {shape.layers} layers x {shape.kv_heads} KV heads x {shape.tokens} tokens "
        f"x head dim {shape.head_dim}, {shape.dtype}: {shape.nbytes:,} bytes a block",
        f"in {args.dir or 'the temporary directory'}; median (min-max) of {args.runs} runs",
    ]
    print(format_section("prefix cache disk tier, per block", rows, machine, notes), flush=True)
    if args.json_path:
        payload = {"kind": "disk-tier", "shape": attrs.asdict(shape), "machine": machine, "runs": runs, "rows": rows}
        write_json(args.json_path, payload)
    return 0
