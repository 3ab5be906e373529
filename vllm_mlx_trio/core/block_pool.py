"""Bookkeeping of the paged prefix cache: which blocks exist, who holds them, what goes.

Pure: no Trio, no MLX, no I/O. The CacheManagerActor owns one :class:`BlockPool`; the
executor holds the KV arrays keyed by block id and is told which token ranges to store
(:meth:`BlockPool.commit`) and which ids to drop (:meth:`BlockPool.evict_over_budget`,
:meth:`BlockPool.clear`).

A prompt is cut into blocks of ``block_size`` tokens; only full blocks are cached. Each is
keyed by a chained hash (:func:`~.block_hash.block_hash`) so a block names its whole prefix;
the request's ``extra_keys`` (image hashes, ``cache_salt``) go into the first block's hash
and thereby into the whole chain. A request *leases* the blocks it looks up or commits; a
block's ``ref_count`` is the number of requests leasing it. Unleased blocks stay cached in a
free queue, least recently used first, and are evicted from its front when over budget.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable, Iterable, Iterator
from typing import Literal

import attrs

from .block_hash import block_hash
from .plan import BlockId, RequestId

_frozen = attrs.frozen(slots=True, kw_only=True)

_optional_ge0 = attrs.validators.optional(attrs.validators.ge(0))

HitKind = Literal["hit", "prefix_hit", "miss"]
Tokens = tuple[int, ...]
ExtraKeys = tuple[Hashable, ...]
"""Per-request keys folded into a sequence's first block hash: image hashes, a cache salt."""


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
    """The leased cached prefix of a prompt: ``num_cached_tokens`` tokens in ``block_ids``."""

    block_ids: tuple[BlockId, ...]
    num_cached_tokens: int
    kind: HitKind


@_frozen
class NewBlock:
    """A block a commit created: store the KV of ``token_ids[token_start:token_end]`` under it."""

    block_id: BlockId
    block_index: int
    token_start: int
    token_end: int


@_frozen
class BlockInfo:
    """A snapshot of one cached block."""

    block_id: BlockId
    block_hash: bytes
    block_index: int
    num_tokens: int
    ref_count: int
    nbytes: int


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
    num_in_use: int
    num_shared: int
    num_free: int
    bytes_used: int
    max_bytes: int | None
    max_blocks: int | None
    over_budget: bool


@attrs.define(slots=True, kw_only=True)
class _Block:
    block_id: BlockId
    block_hash: bytes
    block_index: int
    ref_count: int = 0
    nbytes: int = 0


class BlockPool:
    """Cached full blocks, their leases, and the LRU free queue of unleased ones.

    Block ids come from a counter and are never reused, so a stale id never names a new
    block. Every method is synchronous and costs O(blocks it touches).
    """

    def __init__(self, block_size: int = 64, budget: Budget = NO_BUDGET):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.budget = budget
        self._blocks: dict[BlockId, _Block] = {}
        self._by_hash: dict[bytes, BlockId] = {}
        self._leases: dict[RequestId, dict[BlockId, None]] = {}  # ordered sets
        # unleased blocks; the front is evicted first
        self._free: collections.OrderedDict[BlockId, None] = collections.OrderedDict()
        self._next_id = 0
        self._bytes_used = 0
        self._num_shared = 0
        self._counts = collections.Counter[str]()

    # -- the protocol -------------------------------------------------------------------

    def lookup(
        self, request_id: RequestId, token_ids: Tokens, extra_keys: ExtraKeys = ()
    ) -> PrefixHit:
        """Lease the longest run of cached blocks that starts the prompt.

        The match covers at most ``len(token_ids) - 1`` tokens, since the last prompt token is
        always recomputed for its logits: with ``eligible = max(0, (len(token_ids) - 1) //
        block_size)`` at most ``eligible`` blocks match, one fewer than the prompt's full
        blocks when its length is an exact multiple of ``block_size``. ``kind`` is "miss" when
        no block matches (always so for prompts of at most ``block_size`` tokens), "hit" when
        all ``eligible`` blocks match, and "prefix_hit" otherwise.
        """
        eligible = max(0, (len(token_ids) - 1) // self.block_size)
        block_ids = tuple(self._cached_run(token_ids, extra_keys, eligible))
        for block_id in block_ids:
            self._lease(request_id, block_id)
        kind: HitKind = "hit" if len(block_ids) == eligible else "prefix_hit"
        if not block_ids:
            kind = "miss"
        num_cached_tokens = len(block_ids) * self.block_size
        self._counts["queries"] += 1
        self._counts[kind] += 1
        self._counts["tokens_saved"] += num_cached_tokens
        return PrefixHit(block_ids=block_ids, num_cached_tokens=num_cached_tokens, kind=kind)

    def commit(
        self, request_id: RequestId, token_ids: Tokens, extra_keys: ExtraKeys = ()
    ) -> tuple[NewBlock, ...]:
        """Cache every full block of ``token_ids``, whose KV the request has computed.

        Pass only tokens whose KV exists (at finish: prompt + output minus the last sampled
        token). A block already cached (by anyone) is shared: leased to this request unless
        it holds it already. Other blocks are created, leased to this request and returned,
        so the executor stores their token ranges. Committing again (prompt, then prompt +
        output) leases nothing twice.
        """
        new: list[NewBlock] = []
        size = self.block_size
        for index, h in enumerate(self._chain(token_ids, extra_keys, len(token_ids) // size)):
            block_id = self._by_hash.get(h)
            if block_id is None:
                block_id = self._create(h, index)
                start = index * size
                new.append(
                    NewBlock(
                        block_id=block_id,
                        block_index=index,
                        token_start=start,
                        token_end=start + size,
                    )
                )
            self._lease(request_id, block_id)
        return tuple(new)

    def set_nbytes(self, block_id: BlockId, nbytes: int) -> bool:
        """Record a stored block's real size; False (and nothing done) if it is gone already."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        block = self._blocks.get(block_id)
        if block is None:
            return False
        self._bytes_used += nbytes - block.nbytes
        block.nbytes = nbytes
        return True

    def release(self, request_ids: Iterable[RequestId]) -> None:
        """End these requests' leases; unknown or already released requests are skipped.

        Blocks left unleased join the back of the free queue (most recently used). Among the
        blocks freed by one call, deeper ones (higher ``block_index``, a sequence's tail) are
        queued first, so they are evicted before the heads that other prompts may share.
        """
        assert not isinstance(request_ids, str), "pass a collection of request ids"
        freed: list[_Block] = []
        for request_id in request_ids:
            for block_id in self._leases.pop(request_id, ()):
                block = self._blocks[block_id]
                block.ref_count -= 1
                if block.ref_count == 1:
                    self._num_shared -= 1
                elif block.ref_count == 0:
                    freed.append(block)
        freed.sort(key=lambda b: b.block_index, reverse=True)  # stable: request order kept
        for block in freed:
            self._free[block.block_id] = None

    def evict_over_budget(self) -> tuple[BlockId, ...]:
        """Drop least recently used unleased blocks while over budget; return their ids.

        Leased blocks are never evicted: if only they remain, the pool stays over budget.
        """
        evicted: list[BlockId] = []
        while self._free and self.over_budget:
            block_id, _ = self._free.popitem(last=False)
            self._drop(block_id)
            evicted.append(block_id)
        self._counts["evictions"] += len(evicted)
        return tuple(evicted)

    def clear(self) -> tuple[BlockId, ...]:
        """Drop every unleased block (DELETE /v1/cache); return their ids. Leased ones stay."""
        dropped = tuple(self._free)
        self._free.clear()
        for block_id in dropped:
            self._drop(block_id)
        return dropped

    # -- gauges and accessors -----------------------------------------------------------

    @property
    def over_budget(self) -> bool:
        """Whether the cached blocks exceed either limit of the budget."""
        max_bytes, max_blocks = self.budget.max_bytes, self.budget.max_blocks
        return (max_bytes is not None and self._bytes_used > max_bytes) or (
            max_blocks is not None and len(self._blocks) > max_blocks
        )

    def stats(self) -> PoolStats:
        """Counters and gauges, computed in O(1)."""
        c = self._counts
        return PoolStats(
            num_queries=c["queries"],
            num_hits=c["hit"],
            num_prefix_hits=c["prefix_hit"],
            num_misses=c["miss"],
            tokens_saved=c["tokens_saved"],
            num_evictions=c["evictions"],
            num_blocks=len(self._blocks),
            num_in_use=len(self._blocks) - len(self._free),
            num_shared=self._num_shared,
            num_free=len(self._free),
            bytes_used=self._bytes_used,
            max_bytes=self.budget.max_bytes,
            max_blocks=self.budget.max_blocks,
            over_budget=self.over_budget,
        )

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._blocks

    def block_info(self, block_id: BlockId) -> BlockInfo:
        """A snapshot of a cached block; KeyError if there is none with that id."""
        b = self._blocks[block_id]
        return BlockInfo(
            block_id=b.block_id,
            block_hash=b.block_hash,
            block_index=b.block_index,
            num_tokens=self.block_size,
            ref_count=b.ref_count,
            nbytes=b.nbytes,
        )

    def ref_count(self, block_id: BlockId) -> int:
        """How many requests lease the block; KeyError if it is not cached."""
        return self._blocks[block_id].ref_count

    def holders(self, request_id: RequestId) -> tuple[BlockId, ...]:
        """The blocks a request leases, in the order it got them; () if none."""
        return tuple(self._leases.get(request_id, ()))

    def free_queue(self) -> tuple[BlockId, ...]:
        """Unleased blocks in eviction order (first evicted first)."""
        return tuple(self._free)

    def cached_prefix(self, token_ids: Tokens, extra_keys: ExtraKeys = ()) -> tuple[BlockId, ...]:
        """The cached blocks that start ``token_ids`` (any full block may match); leases nothing."""
        return tuple(self._cached_run(token_ids, extra_keys, len(token_ids) // self.block_size))

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping is consistent (O(all blocks); for tests)."""
        leased = collections.Counter(b for lease in self._leases.values() for b in lease)
        assert all(self._leases.values()), "empty lease kept"
        assert set(leased) <= set(self._blocks), "lease of a block that is not cached"
        assert len(self._by_hash) == len(self._blocks)
        for h, block_id in self._by_hash.items():
            assert self._blocks[block_id].block_hash == h
        for block_id, block in self._blocks.items():
            assert block.block_id == block_id < self._next_id
            assert block.ref_count >= 0 and block.nbytes >= 0
            assert block.ref_count == leased[block_id], "ref_count != number of leases"
            assert (block.ref_count == 0) == (block_id in self._free), "free queue != unleased"
        assert set(self._free) <= set(self._blocks)
        in_use = sum(1 for b in self._blocks.values() if b.ref_count > 0)
        assert len(self._free) + in_use == len(self._blocks)
        assert self._num_shared == sum(1 for b in self._blocks.values() if b.ref_count > 1)
        assert self._bytes_used == sum(b.nbytes for b in self._blocks.values())

    # -- internals ----------------------------------------------------------------------

    def _chain(self, token_ids: Tokens, extra_keys: ExtraKeys, num_blocks: int) -> Iterator[bytes]:
        """The chained hashes of the first ``num_blocks`` blocks, computed lazily."""
        parent: bytes | None = None
        for index in range(num_blocks):
            start = index * self.block_size
            chunk = tuple(token_ids[start : start + self.block_size])
            parent = block_hash(parent, chunk, extra_keys if index == 0 else ())
            yield parent

    def _cached_run(
        self, token_ids: Tokens, extra_keys: ExtraKeys, max_blocks: int
    ) -> Iterator[BlockId]:
        """The ids of the leading cached blocks, at most ``max_blocks``; stops at the first gap."""
        for h in self._chain(token_ids, extra_keys, max_blocks):
            block_id = self._by_hash.get(h)
            if block_id is None:
                return
            yield block_id

    def _create(self, h: bytes, index: int) -> BlockId:
        """A new, unleased and not yet free block under a fresh id."""
        block_id = BlockId(self._next_id)
        self._next_id += 1
        self._blocks[block_id] = _Block(block_id=block_id, block_hash=h, block_index=index)
        self._by_hash[h] = block_id
        return block_id

    def _lease(self, request_id: RequestId, block_id: BlockId) -> None:
        lease = self._leases.setdefault(request_id, {})
        if block_id in lease:
            return
        lease[block_id] = None
        block = self._blocks[block_id]
        block.ref_count += 1
        if block.ref_count == 1:
            self._free.pop(block_id, None)  # a block just created was never free
        elif block.ref_count == 2:
            self._num_shared += 1

    def _drop(self, block_id: BlockId) -> None:
        block = self._blocks.pop(block_id)
        del self._by_hash[block.block_hash]
        self._bytes_used -= block.nbytes
