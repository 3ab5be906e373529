"""Bookkeeping of the paged prefix cache: which blocks exist, who holds them, what goes.

Pure: no Trio, no MLX, no I/O. The CacheManagerActor owns one :class:`BlockPool`; the
executor holds the KV arrays keyed by block id and is told which token ranges to store
(:meth:`BlockPool.commit`) and which ids to drop (:meth:`BlockPool.evict_over_budget`,
:meth:`BlockPool.clear`).

A prompt is cut into blocks of ``block_size`` tokens. Each full block is keyed by a chained
hash (:func:`~.block_hash.block_hash`) so a block names its whole prefix; the request's
``extra_keys`` (``cache_salt``) go into the first block's hash and thereby into the whole
chain; its ``media_keys`` ((start position, content key) of each image or video) go into the
block each item starts in (``core/media_keys.py``), so text before the first image is shared.
A *tail* (``core/child_index.py``) is a checkpoint at any other position:
the tokens after the last full block, keyed by the tokens themselves under that block's
hash, so a repeat or a shared prefix reuses every token it can, not only whole blocks. For
models whose cache is not all full-attention KV, a hit must end where the sliding-window or
recurrent layers' state was saved: at a tail (blocks committed with ``blocks_end_hits=False``
never end a hit themselves). A request *leases* the blocks it looks up or commits; a
block's ``ref_count`` is the number of requests leasing it. Unleased blocks stay cached in a
free queue, least recently used first, and are evicted from its front when over budget.

With a disk budget (``cache.disk_mb``), full blocks that can end a hit are written through to
the disk tier when created (so a restart finds the blocks that were still in memory too) and
*spilled* when evicted: the pool remembers the hash (and size) in a second LRU, bounded by
that budget, and the runner writes the block unless its file is there already (both through
:meth:`BlockPool.take_spilled`). A lookup that runs out
of cached blocks goes on through remembered hashes: each becomes a block again under a new
id, which the runner reads back from disk (``PrefixHit.disk_blocks``). The hashes found on
disk at start are remembered the same way (:meth:`BlockPool.remember_on_disk`).
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator

import attrs

from .child_index import ChildIndex, common_length, root_key
from .media_keys import MediaKeys, chain_hashes, first_difference, media_between, normalize_media_keys
from .plan import BlockId, RequestId
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


@attrs.define(slots=True, kw_only=True)
class _Block:
    block_id: BlockId
    block_hash: bytes  # a tail's: its parent key
    parent: bytes  # the parent key it hangs under in the child index
    tokens: Tokens
    block_index: int  # a tail's: its depth (full blocks before it)
    #: The media keys starting inside it (absolute positions); part of its child-index key.
    media: MediaKeys = ()
    is_tail: bool = False
    #: A hit may end after this entry, or inside it: its model's cache is all plain KV (a
    #: KV prefix of any length is exact). Otherwise only at a tail's end (a checkpoint).
    endable: bool = True
    ref_count: int = 0
    nbytes: int = 0


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
        self._blocks: dict[BlockId, _Block] = {}  # full blocks and tails
        self._by_hash: dict[bytes, BlockId] = {}  # full blocks only
        self._children = ChildIndex()  # full blocks and tails
        self._num_tails = 0
        self._leases: dict[RequestId, dict[BlockId, None]] = {}  # ordered sets
        # unleased entries; the front is evicted first
        self._free: collections.OrderedDict[BlockId, None] = collections.OrderedDict()
        self._next_id = 0
        self._bytes_used = 0
        self._num_shared = 0
        self._counts = collections.Counter[str]()
        #: Bytes of spilled blocks to remember (None: no disk tier).
        self.disk_budget = disk_budget
        self._on_disk: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # hash -> bytes, LRU first
        self._disk_bytes = 0
        self._spilled: list[tuple[BlockId, bytes]] = []

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
        depth, tail_id, num_cached = self._best_end(token_ids, extra_keys, media, chain, limit)
        block_ids = tuple(block_id for _, block_id in chain[:depth])
        if tail_id is not None:
            block_ids += (tail_id,)
        for block_id in block_ids:
            self._lease(request_id, block_id)
        for h, block_id in restored:  # not part of the hit after all: back to disk only
            if block_id not in block_ids:
                nbytes = self._blocks[block_id].nbytes
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
    ) -> tuple[NewBlock, ...]:
        """Cache every full block of ``token_ids``, whose KV the request has computed, and a
        tail at ``tail_at`` tokens when given (the checkpoint the executor holds).

        Pass only tokens whose KV exists. A block already cached (by anyone) is shared: leased
        to this request unless it holds it already. Other blocks are created, leased to this
        request and returned, so the executor stores their token ranges. Committing again
        (prompt, then prompt + output) leases nothing twice. A tail of no tokens is made only
        when blocks cannot end a hit themselves (``blocks_end_hits=False``).
        """
        new: list[NewBlock] = []
        size = self.block_size
        media = normalize_media_keys(media_keys)
        hashes: list[bytes] = []
        for index, h in enumerate(chain_hashes(token_ids, extra_keys, media, size, len(token_ids) // size)):
            parent = hashes[-1] if hashes else root_key(extra_keys)
            hashes.append(h)
            block_id = self._by_hash.get(h)
            if block_id is None:
                start = index * size
                chunk = tuple(token_ids[start : start + size])
                block_media = media_between(media, start, start + size)
                block_id = self._create(h, parent, chunk, index, block_media, endable=blocks_end_hits)
                if self.disk_budget is not None and blocks_end_hits:  # written through to disk
                    self._spilled.append((block_id, h))
                start = index * size
                new.append(NewBlock(block_id=block_id, block_index=index, token_start=start, token_end=start + size))
            self._lease(request_id, block_id)
        if tail_at is not None and 0 < tail_at <= len(token_ids):
            depth = tail_at // size
            tail = tuple(token_ids[depth * size : tail_at])
            if tail or not blocks_end_hits:
                parent = hashes[depth - 1] if depth else root_key(extra_keys)
                tail_media = media_between(media, depth * size, tail_at)
                tail_id = self._children.get(parent, tail, tail_media)
                if tail_id is None:
                    tail_id = self._create_tail(parent, tail, depth, tail_media, endable=blocks_end_hits)
                    new.append(
                        NewBlock(block_id=tail_id, block_index=TAIL_INDEX, token_start=depth * size, token_end=tail_at)
                    )
                self._lease(request_id, tail_id)
        return tuple(new)

    def set_nbytes(self, block_id: BlockId, nbytes: int) -> bool:
        """Record a stored entry's real size; False (and nothing done) if it is gone already."""
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

        Entries left unleased join the back of the free queue (most recently used). Among the
        entries freed by one call, deeper ones (higher ``block_index``, a sequence's tail) are
        queued first, a tail before the full block at its depth, so they are evicted before
        the heads that other prompts may share.
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
        freed.sort(key=lambda b: (b.block_index, b.is_tail), reverse=True)  # stable
        for block in freed:
            self._free[block.block_id] = None

    def evict_over_budget(self) -> tuple[BlockId, ...]:
        """Drop least recently used unleased entries while over budget; return their ids.

        A full block takes the tails under it along (nothing can reach them any more). Leased
        entries are never evicted: if only they remain, the pool stays over budget.
        """
        evicted: list[BlockId] = []
        while self._free and self.over_budget:
            block = self._blocks[next(iter(self._free))]
            spill = self.disk_budget is not None and not block.is_tail and block.endable
            evicted.extend(self._drop(block.block_id))
            if spill and self._remember(block.block_hash, block.nbytes):
                self._spilled.append((block.block_id, block.block_hash))
        self._counts["evictions"] += len(evicted)
        return tuple(evicted)

    def take_spilled(self) -> tuple[tuple[BlockId, bytes], ...]:
        """The (id, hash) of the blocks evicted since the last call that the runner writes to
        the disk tier before dropping them."""
        spilled, self._spilled = tuple(self._spilled), []
        return spilled

    def remember_on_disk(self, h: bytes, nbytes: int) -> None:
        """A block the disk tier holds (found at start): a lookup may read it back."""
        if self.disk_budget is not None and h not in self._by_hash:
            self._remember(h, nbytes)

    @property
    def num_on_disk(self) -> int:
        """How many spilled blocks the pool remembers."""
        return len(self._on_disk)

    @property
    def disk_bytes(self) -> int:
        return self._disk_bytes

    def clear(self) -> tuple[BlockId, ...]:
        """Drop every unleased entry (DELETE /v1/cache); return their ids. Leased ones stay."""
        dropped: list[BlockId] = []
        while self._free:
            dropped.extend(self._drop(next(iter(self._free))))
        self._on_disk.clear()
        self._disk_bytes = 0
        self._spilled.clear()
        return tuple(dropped)

    # -- gauges and accessors -----------------------------------------------------------

    @property
    def over_budget(self) -> bool:
        """Whether the cached entries exceed either limit of the budget."""
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
            num_tails=self._num_tails,
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
        """A snapshot of a cached entry; KeyError if there is none with that id."""
        b = self._blocks[block_id]
        return BlockInfo(
            block_id=b.block_id,
            block_hash=b.block_hash,
            block_index=b.block_index,
            num_tokens=len(b.tokens),
            ref_count=b.ref_count,
            nbytes=b.nbytes,
        )

    def is_tail(self, block_id: BlockId) -> bool:
        """Whether the entry is a tail; KeyError if it is not cached."""
        return self._blocks[block_id].is_tail

    def ref_count(self, block_id: BlockId) -> int:
        """How many requests lease the entry; KeyError if it is not cached."""
        return self._blocks[block_id].ref_count

    def holders(self, request_id: RequestId) -> tuple[BlockId, ...]:
        """The entries a request leases, in the order it got them; () if none."""
        return tuple(self._leases.get(request_id, ()))

    def free_queue(self) -> tuple[BlockId, ...]:
        """Unleased entries in eviction order (first evicted first)."""
        return tuple(self._free)

    def cached_prefix(
        self, token_ids: Tokens, extra_keys: ExtraKeys = (), media_keys: MediaKeys = ()
    ) -> tuple[BlockId, ...]:
        """The cached full blocks that start ``token_ids`` (any may match); leases nothing."""
        num_blocks = len(token_ids) // self.block_size
        media = normalize_media_keys(media_keys)
        return tuple(b for _, b in self._cached_run(token_ids, extra_keys, media, num_blocks))

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping is consistent (O(all entries); for tests)."""
        leased = collections.Counter(b for lease in self._leases.values() for b in lease)
        assert all(self._leases.values()), "empty lease kept"
        assert set(leased) <= set(self._blocks), "lease of a block that is not cached"
        assert len(self._by_hash) + self._num_tails == len(self._blocks) == len(self._children)
        for h, block_id in self._by_hash.items():
            assert self._blocks[block_id].block_hash == h and not self._blocks[block_id].is_tail
        for block_id, block in self._blocks.items():
            assert block.block_id == block_id < self._next_id
            assert block.ref_count >= 0 and block.nbytes >= 0
            assert block.ref_count == leased[block_id], "ref_count != number of leases"
            assert (block.ref_count == 0) == (block_id in self._free), "free queue != unleased"
            assert self._children.get(block.parent, block.tokens, block.media) == block_id
            assert len(block.tokens) < self.block_size if block.is_tail else len(block.tokens) == self.block_size
        assert set(self._free) <= set(self._blocks)
        in_use = sum(1 for b in self._blocks.values() if b.ref_count > 0)
        assert len(self._free) + in_use == len(self._blocks)
        assert self._num_shared == sum(1 for b in self._blocks.values() if b.ref_count > 1)
        assert self._bytes_used == sum(b.nbytes for b in self._blocks.values())
        assert self._disk_bytes == sum(self._on_disk.values())
        assert not set(self._on_disk) & set(self._by_hash), "a hash both in memory and only on disk"
        assert self.disk_budget is None or self._disk_bytes <= self.disk_budget

    # -- internals ----------------------------------------------------------------------

    def _cached_run(
        self, token_ids: Tokens, extra_keys: ExtraKeys, media: MediaKeys, max_blocks: int
    ) -> Iterator[tuple[bytes, BlockId]]:
        """(hash, id) of the leading cached blocks, at most ``max_blocks``; stops at a gap."""
        for h in chain_hashes(token_ids, extra_keys, media, self.block_size, max_blocks):
            block_id = self._by_hash.get(h)
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
        if not self._on_disk or len(chain) >= max_blocks:
            return restored
        size = self.block_size
        for index, h in enumerate(chain_hashes(token_ids, extra_keys, media, size, max_blocks)):
            if index < len(chain):
                continue
            nbytes = self._on_disk.pop(h, None)
            if nbytes is None:
                break
            self._disk_bytes -= nbytes
            parent = chain[-1][0] if chain else root_key(extra_keys)
            start = index * size
            chunk = tuple(token_ids[start : start + size])
            block_id = self._create(h, parent, chunk, index, media_between(media, start, start + size))
            self._blocks[block_id].nbytes = nbytes
            self._bytes_used += nbytes
            chain.append((h, block_id))
            restored.append((h, block_id))
        return restored

    def _remember(self, h: bytes, nbytes: int) -> bool:
        """Remember a spilled block's hash (most recently used), forgetting the least recently
        used over the disk budget; False if it does not fit at all."""
        assert self.disk_budget is not None
        if nbytes > self.disk_budget:
            return False
        self._disk_bytes += nbytes - self._on_disk.pop(h, 0)
        self._on_disk[h] = nbytes
        while self._disk_bytes > self.disk_budget:
            _, forgotten = self._on_disk.popitem(last=False)
            self._disk_bytes -= forgotten
        return True

    def _best_end(
        self,
        token_ids: Tokens,
        extra_keys: ExtraKeys,
        media: MediaKeys,
        chain: list[tuple[bytes, BlockId]],
        limit: int,
    ) -> tuple[int, BlockId | None, int]:
        """Where the longest hit ends: (full blocks, then the id of the entry it ends in or
        None, tokens covered). After ``depth`` full blocks it may end in any child of the last
        one: inside it when its model is all plain KV, else only at a tail's exact end; never
        past a position where the child's media keys and the prompt's disagree."""
        size = self.block_size
        best: tuple[int, BlockId | None, int] = (0, None, 0)
        for depth in range(len(chain) + 1):
            base = depth * size
            if depth and self._blocks[chain[depth - 1][1]].endable:
                best = (depth, None, base)
            parent = chain[depth - 1][0] if depth else root_key(extra_keys)
            rest = tuple(token_ids[base : base + size])
            for tokens, child_id in self._children.candidates(parent, rest):
                child = self._blocks[child_id]
                differ = first_difference(child.media, media_between(media, base, base + len(tokens)))
                media_ok = len(tokens) if differ is None else differ - base
                if child.endable:
                    n = min(common_length(tokens, rest), limit - base, media_ok)
                elif child.is_tail and rest[: len(tokens)] == tokens and media_ok == len(tokens) <= limit - base:
                    n = len(tokens)
                else:
                    continue
                if base + n > best[2]:
                    best = (depth, child_id, base + n)
        return best

    def _create(
        self, h: bytes, parent: bytes, tokens: Tokens, index: int, media: MediaKeys = (), *, endable: bool = True
    ) -> BlockId:
        """A new, unleased and not yet free full block under a fresh id."""
        block_id = BlockId(self._next_id)
        self._next_id += 1
        self._blocks[block_id] = _Block(
            block_id=block_id,
            block_hash=h,
            parent=parent,
            tokens=tokens,
            block_index=index,
            media=media,
            endable=endable,
        )
        self._by_hash[h] = block_id
        self._disk_bytes -= self._on_disk.pop(h, 0)  # in memory again (its file stays)
        self._children.add(parent, tokens, block_id, media)
        return block_id

    def _create_tail(self, parent: bytes, tail: Tokens, depth: int, media: MediaKeys, *, endable: bool) -> BlockId:
        """A new, unleased and not yet free tail under a fresh id."""
        tail_id = BlockId(self._next_id)
        self._next_id += 1
        self._blocks[tail_id] = _Block(
            block_id=tail_id,
            block_hash=parent,
            parent=parent,
            tokens=tail,
            block_index=depth,
            media=media,
            is_tail=True,
            endable=endable,
        )
        self._children.add(parent, tail, tail_id, media)
        self._num_tails += 1
        return tail_id

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

    def _drop(self, block_id: BlockId) -> list[BlockId]:
        """Forget an unleased entry, and a full block's tails with it; the ids dropped."""
        block = self._blocks.pop(block_id)
        assert block.ref_count == 0, "only unleased entries are dropped"
        self._free.pop(block_id, None)
        self._bytes_used -= block.nbytes
        self._children.remove(block.parent, block.tokens, block.media)
        if block.is_tail:
            self._num_tails -= 1
            return [block_id]
        del self._by_hash[block.block_hash]
        dropped = [block_id]
        orphans = [c for c in self._children.under(block.block_hash) if self._blocks[c].is_tail]
        for tail_id in orphans:
            dropped.extend(self._drop(tail_id))
        return dropped
