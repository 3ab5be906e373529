"""The block pool's plain data: its budget, a lookup's hit, a commit's new entries, snapshots
and counters. Pure: no Trio, no MLX, no I/O."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal

import attrs

from ..plan import BlockId

_frozen = attrs.frozen(slots=True, kw_only=True)

_optional_ge0 = attrs.validators.optional(attrs.validators.ge(0))

HitKind = Literal["hit", "prefix_hit", "miss"]
Tokens = tuple[int, ...]
ExtraKeys = tuple[Hashable, ...]
"""Per-request keys folded into a sequence's first block hash: image hashes, a cache salt."""

TAIL_INDEX = -1
"""The ``block_index`` of a :class:`NewBlock` that is a tail (a checkpoint), not a full block."""


def boundary_store_index(k: int) -> int:
    """The copy index (in a commit's store list) of its ``k``-th boundary snapshot."""
    return TAIL_INDEX - 1 - k


def boundary_of(store_index: int) -> int | None:
    """Which boundary snapshot a copy index names (None: a block or the tail)."""
    return TAIL_INDEX - 1 - store_index if store_index < TAIL_INDEX else None


@_frozen
class Budget:
    """How much the pool may keep: bytes of KV (memory-aware), blocks (legacy), or both.

    None means no limit of that kind. Blocks whose size is not reported yet count 0 bytes.
    """

    max_bytes: int | None = attrs.field(default=None, validator=_optional_ge0)
    max_blocks: int | None = attrs.field(default=None, validator=_optional_ge0)


#: No limit of either kind (the pool's default).
NO_BUDGET = Budget()


@_frozen
class PrefixHit:
    """The leased cached prefix of a prompt: ``num_cached_tokens`` tokens in ``block_ids``
    (full blocks in order, then at most one tail)."""

    block_ids: tuple[BlockId, ...]
    num_cached_tokens: int
    kind: HitKind
    #: Those of ``block_ids`` read back from the disk tier: (id, block hash).
    disk_blocks: tuple[tuple[BlockId, bytes], ...] = ()


@_frozen
class NewBlock:
    """A block a commit created: store the KV of ``token_ids[token_start:token_end]`` under it.

    A tail has ``block_index == TAIL_INDEX``: store the checkpoint at ``token_end``."""

    block_id: BlockId
    block_index: int
    token_start: int
    token_end: int

    @property
    def is_tail(self) -> bool:
        return self.block_index == TAIL_INDEX


@_frozen
class BlockInfo:
    """A snapshot of one cached block."""

    block_id: BlockId
    block_hash: bytes
    block_index: int
    num_tokens: int
    ref_count: int
    nbytes: int
    #: A tail (a sequence's last partial block, or a boundary snapshot), not a full block.
    is_tail: bool = False


@_frozen
class PoolStats:
    """Counters since the pool was made, and gauges of now."""

    num_queries: int
    num_hits: int
    num_prefix_hits: int
    num_misses: int
    tokens_saved: int
    num_evictions: int
    num_blocks: int
    num_tails: int
    num_in_use: int
    num_shared: int
    num_free: int
    bytes_used: int
    max_bytes: int | None
    max_blocks: int | None
    over_budget: bool
    #: Spilled blocks the disk tier holds, and their bytes (0 without a disk tier).
    num_on_disk: int
    disk_bytes: int
