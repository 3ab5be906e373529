"""What the disk tier costs per block, on random KV blocks (``vllm-mlx-trio bench disk-tier``).

Each run spills the blocks into a fresh :class:`DiskTier` and times three things, per block:
the spill on the calling thread (the MLX thread's share: numpy views queued for the writer),
the spill until the writer thread has encoded, checksummed and written every block, and a load
of each back from its file (read, check, to MLX, evaluated). The blocks are made once and
reused by every run; each run writes them under new keys into a directory of its own.
"""

from __future__ import annotations

import os
import tempfile
import time

import attrs
import mlx.core as mx

from .disk_tier import DiskTier
from .layers import BlockArrays

#: The tier's byte budget: room for every block a run writes.
BUDGET_BYTES = 1 << 40
#: The ``model_id`` the tier's files carry.
MODEL_ID = "bench-disk-tier"
PHASES = ("spill_ms", "written_ms", "load_ms")


@attrs.frozen(kw_only=True)
class BlockShape:
    """One block's KV: per layer a key and a value of ``(1, kv_heads, tokens, head_dim)``."""

    layers: int = 32
    kv_heads: int = 8
    tokens: int = 64
    head_dim: int = 128
    dtype: str = "float16"

    @property
    def nbytes(self) -> int:
        item = getattr(mx, self.dtype).size
        return self.layers * 2 * self.kv_heads * self.tokens * self.head_dim * item


def random_blocks(shape: BlockShape, count: int, seed: int = 0) -> list[BlockArrays]:
    """``count`` blocks of normal random values, evaluated."""
    mx.random.seed(seed)
    dims = (1, shape.kv_heads, shape.tokens, shape.head_dim)
    dtype = getattr(mx, shape.dtype)
    blocks = [
        [(mx.random.normal(dims).astype(dtype), mx.random.normal(dims).astype(dtype)) for _ in range(shape.layers)]
        for _ in range(count)
    ]
    mx.eval(blocks)
    return blocks


def time_run(blocks: list[BlockArrays], run: int, parent: str | None = None) -> dict[str, float]:
    """One run: milliseconds per block of each of ``PHASES``."""
    keys = [run.to_bytes(4, "little") + index.to_bytes(4, "little") for index in range(len(blocks))]
    with tempfile.TemporaryDirectory(prefix="disk-tier-", dir=parent) as directory:
        tier = DiskTier(directory, BUDGET_BYTES, MODEL_ID)
        try:
            start = time.perf_counter()
            kept = [tier.spill(key, block) for key, block in zip(keys, blocks, strict=True)]
            spilled = time.perf_counter()
            tier.flush()
            written = time.perf_counter()
            for key in keys:
                loaded = tier.load(key)
                if loaded is None:
                    raise RuntimeError(f"block {key.hex()} did not load back from {directory}")
                mx.eval([array for pair in loaded for array in pair])
            loaded_at = time.perf_counter()
        finally:
            tier.close()
    if not all(kept):
        raise RuntimeError(f"{kept.count(False)} of {len(blocks)} blocks not spilled (the writer's queue is full)")
    per_block = 1000 / len(blocks)
    return {
        "spill_ms": (spilled - start) * per_block,
        "written_ms": (written - start) * per_block,
        "load_ms": (loaded_at - written) * per_block,
    }


def measure_disk_tier(
    shape: BlockShape, *, blocks: int, runs: int, directory: str | os.PathLike[str] | None = None
) -> list[dict[str, float]]:
    """``runs`` runs of ``blocks`` blocks of ``shape``, in temporary directories under
    ``directory`` (default: the system's temporary directory)."""
    made = random_blocks(shape, blocks)
    parent = None if directory is None else os.fspath(directory)
    return [time_run(made, run, parent) for run in range(runs)]
