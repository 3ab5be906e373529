"""``bench prefix-cache`` rows of the cache's tiers: 5a-5f quantized blocks (``cache.kv_bits``),
6a-6c hits served from the disk tier (``cache.disk_dir``).

For the disk rows: prompt 1 on an engine with a disk tier (its blocks are written through to disk when created),
then a new engine over the same directory, as after a restart: its memory holds nothing, so
prompt 1's hit is read back from disk. The hit's TTFT is read against the first engine's
cold run and its warm (in-memory) repeat.
"""

from __future__ import annotations

import tempfile

import attrs
import trio

from ...actors.prefix.cache_manager import cache_budget
from ...config import EngineConfig
from ...engine import Engine, open_engine
from .table import HIT, Outcome, Prompts, Row, request_row, run_request, same_tokens_row


async def quantized_rows(cfg: EngineConfig, prompts: Prompts) -> list[Row]:
    """5a-5f: prompt 1 and its repeat with stored blocks kept quantized (``cache.kv_bits``)
    and not: each repeat must hit; a block's bytes, how many fit the budget, the hit's TTFT
    and its agreement with the unquantized repeat are measurements to read."""
    rows: list[Row] = []
    plain: Outcome | None = None
    for step, bits in zip("ace", (None, 8, 4), strict=True):
        quantized = attrs.evolve(cfg, cache=attrs.evolve(cfg.cache, enabled=True, kv_bits=bits))
        async with open_engine(quantized) as engine:
            await run_request(engine, prompts.one)
            hit = await run_request(engine, prompts.one, logprobs=True)
            block_bytes = await _block_bytes(engine)
            budget = cache_budget(quantized.cache).max_bytes
        name = f"kv_bits={bits or 'none'}"
        plain = plain or hit
        agree = sum(a == b for a, b in zip(hit.token_ids, plain.token_ids, strict=False))
        diff = max((abs(a - b) for a, b in zip(hit.logprobs, plain.logprobs, strict=False)), default=0.0)
        fits = f", {budget // block_bytes} fit the budget" if budget and block_bytes else ""
        rows += [
            request_row(f"5{step}", f"{name}: prompt 1 again", (HIT,), hit),
            Row(
                step=f"5{chr(ord(step) + 1)}",
                description=f"{name}: block, agreement",
                expected="measured",
                actual=f"{block_bytes} B/block{fits}; {agree}/{len(plain.token_ids)} tokens, max dlogprob {diff:.2g}",
                passed=True,
                info=True,
            ),
        ]
    return rows


async def _block_bytes(engine: Engine) -> int:
    """The mean bytes of a stored full block, once the last request's leases are back."""
    with trio.move_on_after(5):
        while engine.statistics().cache.num_leased:  # noqa: ASYNC110 statistics offer no event for the release
            await trio.sleep(0.005)
    blocks = [b for b in engine.prefix_blocks() if not b.is_tail and not b.ref_count]
    return sum(b.nbytes for b in blocks) // max(1, len(blocks))


async def disk_tier_rows(cfg: EngineConfig, prompts: Prompts) -> list[Row]:
    with tempfile.TemporaryDirectory(prefix="prefix-disk-") as directory:
        disk = attrs.evolve(cfg, cache=attrs.evolve(cfg.cache, enabled=True, disk_dir=directory))
        async with open_engine(disk) as engine:
            cold = await run_request(engine, prompts.one)
            memory = await run_request(engine, prompts.one)
        async with open_engine(disk) as engine:  # a restart: nothing in memory
            on_disk = engine.statistics().cache.pool.num_on_disk
            from_disk = await run_request(engine, prompts.one)
            read_back = on_disk - engine.statistics().cache.pool.num_on_disk
    ratio = from_disk.ttft_s / cold.ttft_s if cold.ttft_s else float("inf")
    return [
        attrs.evolve(
            request_row("6a", "Disk tier: prompt 1 after a restart", (HIT,), from_disk),
            actual=f"{from_disk.kind}, {read_back} blocks read from disk",
            passed=from_disk.kind == HIT and read_back > 0 and from_disk.cached_tokens > 0,
        ),
        Row(
            step="6b",
            description="Disk hit TTFT / cold, memory hit",
            expected="measured",
            actual=f"{ratio:.2f} of {cold.ttft_s * 1000:.1f} ms cold; memory hit {memory.ttft_s * 1000:.1f} ms",
            passed=True,
            info=True,
        ),
        same_tokens_row("6c", "Disk hit = computed output", (cold, memory, from_disk)),
    ]
