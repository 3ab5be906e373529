"""Disk tier cost per block: what a spill costs the calling (MLX) thread, the write behind it, a load.

Run from the repository root: PYTHONPATH=. .venv/bin/python scripts/bench_disk_tier.py
(medians of 3 runs of 8 blocks, each the 64-token block of a 32-layer, 8-KV-head, head-dim-128
float16 model: 8 MiB).
"""

from __future__ import annotations

import statistics
import tempfile
import time

import mlx.core as mx

from vllm_mlx_trio.worker.prefix.disk_tier import DiskTier

LAYERS, HEADS, TOKENS, DIM = 32, 8, 64, 128
BLOCKS, RUNS = 8, 3


def block(seed: int) -> list:
    mx.random.seed(seed)
    shape = (1, HEADS, TOKENS, DIM)
    pairs = [tuple(mx.random.normal(shape).astype(mx.float16) for _ in "kv") for _ in range(LAYERS)]
    mx.eval(pairs)
    return pairs


def one_run(blocks: list, run: int) -> tuple[float, float, float]:
    keys = [bytes([i, run]) * 8 for i in range(len(blocks))]
    with tempfile.TemporaryDirectory() as directory:
        tier = DiskTier(directory, 1 << 30, "bench")
        t0 = time.perf_counter()
        for key, b in zip(keys, blocks, strict=True):
            tier.spill(key, b)
        t1 = time.perf_counter()
        tier.flush()
        t2 = time.perf_counter()
        for key in keys:
            loaded = tier.load(key)
            mx.eval([a for pair in loaded for a in pair])
        t3 = time.perf_counter()
        tier.close()
    per_block = 1000 / len(blocks)
    return (t1 - t0) * per_block, (t2 - t0) * per_block, (t3 - t2) * per_block


def main() -> None:
    blocks = [block(i) for i in range(BLOCKS)]
    runs = [one_run(blocks, run) for run in range(RUNS)]
    for index, name in enumerate(("spill (caller thread)", "spill until written", "load")):
        values = [r[index] for r in runs]
        spread = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {statistics.median(values):.1f} ms/block (runs {spread})")


if __name__ == "__main__":
    main()
