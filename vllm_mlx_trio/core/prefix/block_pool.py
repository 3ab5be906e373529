"""Bookkeeping of the paged prefix cache: which blocks exist, who holds them, what goes.

Pure: no Trio, no MLX, no I/O. The CacheManagerActor owns one :class:`BlockPool`; the
executor holds the KV arrays keyed by block id and is told which token ranges to store
(:meth:`BlockPool.commit`) and which ids to drop (:meth:`BlockPool.evict_over_budget`,
:meth:`BlockPool.clear`).

A prompt is cut into blocks of ``block_size`` tokens. Each full block is keyed by a chained
hash (:func:`~.block_hash.block_hash`) so a block names its whole prefix; the request's
``extra_keys`` (``cache_salt``) go into the first block's hash and thereby into the whole
chain; its ``media_keys`` ((start position, content key) of each image or video) go into the
block each item starts in (``core/prefix/media_keys.py``), so text before the first image is shared.
A *tail* (``core/prefix/child_index.py``) is a checkpoint at any other position:
the tokens after the last full block, keyed by the tokens themselves under that block's
hash, so a repeat or a shared prefix reuses every token it can, not only whole blocks. For
models whose cache is not all full-attention KV, a hit must end where the sliding-window or
recurrent layers' state was saved: at a tail (blocks committed with ``blocks_end_hits=False``
never end a hit themselves).

The pieces: the entries and their indices (``core/prefix/pool_entries.py``), leases and the LRU free
queue (``core/prefix/pool_leases.py``), where a hit ends (``core/prefix/pool_match.py``) and the hashes only the disk
tier holds (``core/prefix/pool_disk.py``). A lookup that runs out of cached blocks goes on through those
remembered hashes: each becomes a block again under a new id, which the runner reads back from
disk (``PrefixHit.disk_blocks``).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

from ..plan import BlockId, RequestId
from .child_index import root_key
from .media_keys import MediaKeys, chain_hashes, media_between, normalize_media_keys
from .pool_disk import DiskIndex
from .pool_entries import EntryTable
from .pool_leases import Leases
from .pool_match import best_end
from .pool_types import (
    NO_BUDGET,
    TAIL_INDEX,
    BlockInfo,
    Budget,
    ExtraKeys,
    HitKind,
    NewBlock,
    PoolStats,
    PrefixHit,
    Tokens,
)

__all__ = [
    "NO_BUDGET",
    "TAIL_INDEX",
    "BlockInfo",
    "BlockPool",
    "Budget",
    "ExtraKeys",
    "HitKind",
    "NewBlock",
    "PoolStats",
    "PrefixHit",
    "Tokens",
]


#: The disk tier's file name for a block: its hash in hex, then this.
DISK_BLOCK_SUFFIX = ".safetensors"


class BlockPool:
    """Cached full blocks and tails, their leases, and the LRU free queue of unleased ones.

    Block ids come from one counter (blocks and tails alike) and are never reused, so a stale
    id never names a new entry. Every method is synchronous and costs O(entries it touches).
    """

    def __init__(self, block_size: int = 64, budget: Budget = NO_BUDGET, disk_budget: int | None = None):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.budget = budget
        self._table = EntryTable()
        self._leases = Leases(self._table)
        self._counts = collections.Counter[str]()
        #: Bytes of spilled blocks to remember (None: no disk tier).
        self.disk_budget = disk_budget
        self._disk = DiskIndex(disk_budget) if disk_budget is not None else None

    # -- the protocol -------------------------------------------------------------------

    def lookup(
        self, request_id: RequestId, token_ids: Tokens, extra_keys: ExtraKeys = (), media_keys: MediaKeys = ()
    ) -> PrefixHit:
        """Lease the longest cached prefix of the prompt: full blocks, then maybe a tail.

        The match covers at most ``len(token_ids) - 1`` tokens, since the last prompt token is
        always recomputed for its logits. ``kind`` is "miss" when nothing matches, "hit" when
        the match reaches at least every eligible full block (``(len(token_ids) - 1) //
        block_size`` of them), and "prefix_hit" otherwise. ``media_keys`` ((start position,
        content key), ...) fold into the blocks from the one each media item starts in.
        """
        media = normalize_media_keys(media_keys)
        limit = len(token_ids) - 1
        eligible = max(0, limit // self.block_size)
        chain = list(self._cached_run(token_ids, extra_keys, media, eligible))
        restored = self._restore_from_disk(token_ids, extra_keys, media, chain, eligible)
        depth, tail_id, num_cached = best_end(
            self._table, self.block_size, (token_ids, extra_keys, media), chain, limit
        )
        block_ids = tuple(block_id for _, block_id in chain[:depth])
        if tail_id is not None:
            block_ids += (tail_id,)
        for block_id in block_ids:
            self._leases.lease(request_id, block_id)
        for h, block_id in restored:  # not part of the hit after all: back to disk only
            if block_id not in block_ids:
                nbytes = self._table[block_id].nbytes
                self._drop(block_id)
                self._remember(h, nbytes)
        kind: HitKind = "hit" if num_cached >= eligible * self.block_size else "prefix_hit"
        if not num_cached:
            kind = "miss"
        self._counts["queries"] += 1
        self._counts[kind] += 1
        self._counts["tokens_saved"] += num_cached
        disk_blocks = tuple((block_id, h) for h, block_id in restored if block_id in block_ids)
        return PrefixHit(block_ids=block_ids, num_cached_tokens=num_cached, kind=kind, disk_blocks=disk_blocks)

    def commit(
        self,
        request_id: RequestId,
        token_ids: Tokens,
        extra_keys: ExtraKeys = (),
        media_keys: MediaKeys = (),
        *,
        tail_at: int | None = None,
        blocks_end_hits: bool = True,
        boundary_at: tuple[int, ...] = (),
    ) -> tuple[NewBlock, ...]:
        """Cache every full block of ``token_ids``, whose KV the request has computed, and a
        tail at ``tail_at`` tokens when given (the checkpoint the executor holds).

        Pass only tokens whose KV exists. A block already cached (by anyone) is shared: leased
        to this request unless it holds it already. Other blocks are created, leased to this
        request and returned, so the executor stores their token ranges. Committing again
        (prompt, then prompt + output) leases nothing twice. A tail of no tokens is made only
        when blocks cannot end a hit themselves (``blocks_end_hits=False``): at ``tail_at``, and
        at each block boundary of ``boundary_at`` (snapshots taken inside the prefill), so a
        prompt sharing only a prefix can end its hit there.
        """
        new: list[NewBlock] = []
        size = self.block_size
        media = normalize_media_keys(media_keys)
        hashes: list[bytes] = []
        for index, h in enumerate(chain_hashes(token_ids, extra_keys, media, size, len(token_ids) // size)):
            parent = hashes[-1] if hashes else root_key(extra_keys)
            hashes.append(h)
            block_id = self._table.by_hash.get(h)
            if block_id is None:
                start = index * size
                block_id = self._create(h, parent, token_ids, index, media, endable=blocks_end_hits)
                if self._disk is not None and blocks_end_hits:  # written through to disk
                    self._disk.spill(block_id, h)
                new.append(NewBlock(block_id=block_id, block_index=index, token_start=start, token_end=start + size))
            self._leases.lease(request_id, block_id)
        checkpoints = () if blocks_end_hits else tuple(at for at in boundary_at if at % size == 0)
        if tail_at is not None:
            checkpoints += (tail_at,)
        for at in checkpoints:
            if 0 < at <= len(token_ids):
                parents = [root_key(extra_keys), *hashes]
                new.extend(self._commit_tail(request_id, token_ids, media, parents, at, blocks_end_hits))
        return tuple(new)

    def _commit_tail(
        self,
        request_id: RequestId,
        token_ids: Tokens,
        media: MediaKeys,
        parents: list[bytes],
        at: int,
        blocks_end_hits: bool,
    ) -> list[NewBlock]:
        """Lease the tail at ``at`` tokens, creating it if new; ``parents[d]`` is the parent
        key of depth ``d`` (the root key, then the prompt's block hashes)."""
        depth = at // self.block_size
        tail = tuple(token_ids[depth * self.block_size : at])
        if not tail and blocks_end_hits:
            return []
        parent = parents[depth]
        tail_media = media_between(media, depth * self.block_size, at)
        tail_id = self._table.children.get(parent, tail, tail_media)
        new = []
        if tail_id is None:
            tail_id = self._table.create_tail(parent, tail, depth, tail_media, endable=blocks_end_hits).block_id
            start = depth * self.block_size
            new.append(NewBlock(block_id=tail_id, block_index=TAIL_INDEX, token_start=start, token_end=at))
        self._leases.lease(request_id, tail_id)
        return new

    def set_nbytes(self, block_id: BlockId, nbytes: int) -> bool:
        """Record a stored entry's real size; False (and nothing done) if it is gone already."""
        return self._table.set_nbytes(block_id, nbytes)

    def release(self, request_ids: Iterable[RequestId]) -> None:
        """End these requests' leases; unknown or already released requests are skipped.

        Entries left unleased join the back of the free queue (most recently used), deepest
        first (see :meth:`Leases.release`), so they are evicted before shared heads.
        """
        assert not isinstance(request_ids, str), "pass a collection of request ids"
        self._leases.release(request_ids)

    def evict_over_budget(self) -> tuple[BlockId, ...]:
        """Drop least recently used unleased entries while over budget; return their ids.

        A full block takes the tails under it along (nothing can reach them any more). Leased
        entries are never evicted: if only they remain, the pool stays over budget.
        """
        evicted: list[BlockId] = []
        while self._leases.free and self.over_budget:
            entry = self._table[next(iter(self._leases.free))]
            spill = self._disk is not None and not entry.is_tail and entry.endable
            evicted.extend(self._drop(entry.block_id))
            if spill and self._remember(entry.block_hash, entry.nbytes):
                self._disk.spill(entry.block_id, entry.block_hash)
        self._counts["evictions"] += len(evicted)
        return tuple(evicted)

    def take_spilled(self) -> tuple[tuple[BlockId, bytes], ...]:
        """The (id, hash) of the blocks evicted since the last call that the runner writes to
        the disk tier before dropping them."""
        return self._disk.take_spilled() if self._disk is not None else ()

    def remember_on_disk(self, h: bytes, nbytes: int) -> None:
        """A block the disk tier holds (found at start): a lookup may read it back."""
        if self._disk is not None and h not in self._table.by_hash:
            self._remember(h, nbytes)

    @property
    def num_on_disk(self) -> int:
        """How many spilled blocks the pool remembers."""
        return len(self._disk) if self._disk is not None else 0

    @property
    def disk_bytes(self) -> int:
        return self._disk.bytes if self._disk is not None else 0

    def clear(self) -> tuple[BlockId, ...]:
        """Drop every unleased entry (DELETE /v1/cache); return their ids. Leased ones stay."""
        dropped: list[BlockId] = []
        while self._leases.free:
            dropped.extend(self._drop(next(iter(self._leases.free))))
        if self._disk is not None:
            self._disk.clear()
        return tuple(dropped)

    # -- gauges and accessors -----------------------------------------------------------

    @property
    def over_budget(self) -> bool:
        """Whether the cached entries exceed either limit of the budget."""
        max_bytes, max_blocks = self.budget.max_bytes, self.budget.max_blocks
        return (max_bytes is not None and self._table.bytes_used > max_bytes) or (
            max_blocks is not None and len(self._table) > max_blocks
        )

    def stats(self) -> PoolStats:
        """Counters and gauges, computed in O(1)."""
        c = self._counts
        num_free = len(self._leases.free)
        return PoolStats(
            num_queries=c["queries"],
            num_hits=c["hit"],
            num_prefix_hits=c["prefix_hit"],
            num_misses=c["miss"],
            tokens_saved=c["tokens_saved"],
            num_evictions=c["evictions"],
            num_blocks=len(self._table),
            num_tails=self._table.num_tails,
            num_in_use=len(self._table) - num_free,
            num_shared=self._leases.num_shared,
            num_free=num_free,
            bytes_used=self._table.bytes_used,
            max_bytes=self.budget.max_bytes,
            max_blocks=self.budget.max_blocks,
            over_budget=self.over_budget,
            num_on_disk=self.num_on_disk,
            disk_bytes=self.disk_bytes,
        )

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._table

    @property
    def next_id(self) -> int:
        """The id the next new entry gets (every id below it was used once)."""
        return self._table.next_id

    def block_info(self, block_id: BlockId) -> BlockInfo:
        """A snapshot of a cached entry; KeyError if there is none with that id."""
        return self._table[block_id].info()

    def is_tail(self, block_id: BlockId) -> bool:
        """Whether the entry is a tail; KeyError if it is not cached."""
        return self._table[block_id].is_tail

    def ref_count(self, block_id: BlockId) -> int:
        """How many requests lease the entry; KeyError if it is not cached."""
        return self._table[block_id].ref_count

    def holders(self, request_id: RequestId) -> tuple[BlockId, ...]:
        """The entries a request leases, in the order it got them; () if none."""
        return self._leases.holders(request_id)

    def free_queue(self) -> tuple[BlockId, ...]:
        """Unleased entries in eviction order (first evicted first)."""
        return tuple(self._leases.free)

    def cached_prefix(
        self, token_ids: Tokens, extra_keys: ExtraKeys = (), media_keys: MediaKeys = ()
    ) -> tuple[BlockId, ...]:
        """The cached full blocks that start ``token_ids`` (any may match); leases nothing."""
        num_blocks = len(token_ids) // self.block_size
        media = normalize_media_keys(media_keys)
        return tuple(b for _, b in self._cached_run(token_ids, extra_keys, media, num_blocks))

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping is consistent (O(all entries); for tests)."""
        self._table.check_invariants(self.block_size)
        self._leases.check_invariants()
        if self._disk is not None:
            self._disk.check_invariants(self._table.by_hash)

    # -- internals ----------------------------------------------------------------------

    def _cached_run(
        self, token_ids: Tokens, extra_keys: ExtraKeys, media: MediaKeys, max_blocks: int
    ) -> Iterator[tuple[bytes, BlockId]]:
        """(hash, id) of the leading cached blocks, at most ``max_blocks``; stops at a gap."""
        for h in chain_hashes(token_ids, extra_keys, media, self.block_size, max_blocks):
            block_id = self._table.by_hash.get(h)
            if block_id is None:
                return
            yield h, block_id

    def _restore_from_disk(
        self,
        token_ids: Tokens,
        extra_keys: ExtraKeys,
        media: MediaKeys,
        chain: list[tuple[bytes, BlockId]],
        max_blocks: int,
    ) -> list[tuple[bytes, BlockId]]:
        """Extend ``chain`` (in place) through spilled blocks, each a new unleased block again;
        their (hash, id)."""
        restored: list[tuple[bytes, BlockId]] = []
        if not self._disk or len(chain) >= max_blocks:
            return restored
        for index, h in enumerate(chain_hashes(token_ids, extra_keys, media, self.block_size, max_blocks)):
            if index < len(chain):
                continue
            nbytes = self._disk.take(h)
            if nbytes is None:
                break
            parent = chain[-1][0] if chain else root_key(extra_keys)
            block_id = self._create(h, parent, token_ids, index, media)
            self._table.set_nbytes(block_id, nbytes)
            chain.append((h, block_id))
            restored.append((h, block_id))
        return restored

    def _remember(self, h: bytes, nbytes: int) -> bool:
        assert self._disk is not None
        return self._disk.remember(h, nbytes)

    def _create(
        self, h: bytes, parent: bytes, token_ids: Tokens, index: int, media: MediaKeys, *, endable: bool = True
    ) -> BlockId:
        """A new, unleased and not yet free full block ``index`` of ``token_ids``."""
        start = index * self.block_size
        chunk = tuple(token_ids[start : start + self.block_size])
        block_media = media_between(media, start, start + self.block_size)
        entry = self._table.create_block(h, parent, chunk, index, block_media, endable=endable)
        if self._disk is not None:
            self._disk.take(h)  # in memory again (its file stays)
        return entry.block_id

    def _drop(self, block_id: BlockId) -> list[BlockId]:
        """Forget an unleased entry, and a full block's tails with it; the ids dropped."""
        entry = self._table.remove(block_id)
        assert entry.ref_count == 0, "only unleased entries are dropped"
        self._leases.free.pop(block_id, None)
        if entry.is_tail:
            return [block_id]
        dropped = [block_id]
        for tail_id in self._table.tails_under(entry.block_hash):
            dropped.extend(self._drop(tail_id))
        return dropped
