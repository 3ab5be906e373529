"""The block pool's memory of the disk tier: which block hashes have a file to read back. Pure.

With a disk budget (``cache.disk_mb``), full blocks that can end a hit are written through to
the disk tier when created (so a restart finds the blocks that were still in memory too) and
*spilled* when evicted: the pool remembers the hash (and size) here, in an LRU bounded by that
budget, and the runner writes the block unless its file is there already (both through
:meth:`DiskIndex.take_spilled`). The hashes found on disk at start are remembered the same way.
"""

from __future__ import annotations

import collections

from ..plan import BlockId


class DiskIndex:
    """Hashes of blocks only on disk, least recently used first, within ``budget`` bytes."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._sizes: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # hash -> bytes
        self.bytes = 0
        self._spilled: list[tuple[BlockId, bytes]] = []

    def __len__(self) -> int:
        return len(self._sizes)

    def __bool__(self) -> bool:
        return bool(self._sizes)

    def remember(self, h: bytes, nbytes: int) -> bool:
        """Remember a block's hash (most recently used), forgetting the least recently used
        over the budget; False if it does not fit at all."""
        if nbytes > self.budget:
            return False
        self.bytes += nbytes - self._sizes.pop(h, 0)
        self._sizes[h] = nbytes
        while self.bytes > self.budget:
            _, forgotten = self._sizes.popitem(last=False)
            self.bytes -= forgotten
        return True

    def take(self, h: bytes) -> int | None:
        """Forget a hash that is in memory again; its size, or None if it was not remembered."""
        nbytes = self._sizes.pop(h, None)
        if nbytes is not None:
            self.bytes -= nbytes
        return nbytes

    def spill(self, block_id: BlockId, h: bytes) -> None:
        """The runner writes this block to the disk tier (before dropping it, if evicted)."""
        self._spilled.append((block_id, h))

    def take_spilled(self) -> tuple[tuple[BlockId, bytes], ...]:
        """The (id, hash) of the blocks to write since the last call."""
        spilled, self._spilled = tuple(self._spilled), []
        return spilled

    def clear(self) -> None:
        self._sizes.clear()
        self.bytes = 0
        self._spilled.clear()

    def check_invariants(self, in_memory: dict[bytes, BlockId]) -> None:
        assert self.bytes == sum(self._sizes.values())
        assert not set(self._sizes) & set(in_memory), "a hash both in memory and only on disk"
        assert self.bytes <= self.budget
