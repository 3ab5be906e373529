"""The block pool's entries: full blocks and tails by id, by hash and by parent. Pure.

One table holds every cached entry once, under an id from a counter that never repeats, and
keeps three views of it consistent: by id, full blocks by chained hash, and every entry by
(parent key, tokens, media) in the :class:`~.child_index.ChildIndex`. Leases and the free
queue are :mod:`.pool_leases`; what is only on disk is :mod:`.pool_disk`.
"""

from __future__ import annotations

import attrs

from ..plan import BlockId
from .child_index import ChildIndex
from .media_keys import MediaKeys
from .pool_types import BlockInfo, Tokens


@attrs.define(slots=True, kw_only=True)
class Entry:
    """One cached full block or tail."""

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

    def info(self) -> BlockInfo:
        return BlockInfo(
            block_id=self.block_id,
            block_hash=self.block_hash,
            block_index=self.block_index,
            num_tokens=len(self.tokens),
            ref_count=self.ref_count,
            nbytes=self.nbytes,
            is_tail=self.is_tail,
        )


class EntryTable:
    """Every cached entry, by id, by hash (full blocks) and by parent (all)."""

    def __init__(self) -> None:
        self.by_id: dict[BlockId, Entry] = {}
        self.by_hash: dict[bytes, BlockId] = {}
        self.children = ChildIndex()
        self.num_tails = 0
        self.next_id = 0
        self.bytes_used = 0

    def __len__(self) -> int:
        return len(self.by_id)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self.by_id

    def __getitem__(self, block_id: BlockId) -> Entry:
        return self.by_id[block_id]

    def create_block(
        self, h: bytes, parent: bytes, tokens: Tokens, index: int, media: MediaKeys = (), *, endable: bool = True
    ) -> Entry:
        """A new, unleased full block under a fresh id."""
        entry = self._add(
            Entry(
                block_id=self._new_id(),
                block_hash=h,
                parent=parent,
                tokens=tokens,
                block_index=index,
                media=media,
                endable=endable,
            )
        )
        self.by_hash[h] = entry.block_id
        return entry

    def create_tail(self, parent: bytes, tail: Tokens, depth: int, media: MediaKeys, *, endable: bool) -> Entry:
        """A new, unleased tail under a fresh id."""
        entry = Entry(
            block_id=self._new_id(),
            block_hash=parent,
            parent=parent,
            tokens=tail,
            block_index=depth,
            media=media,
            is_tail=True,
            endable=endable,
        )
        self.num_tails += 1
        return self._add(entry)

    def set_nbytes(self, block_id: BlockId, nbytes: int) -> bool:
        """Record an entry's real size; False (and nothing done) if it is gone already."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        entry = self.by_id.get(block_id)
        if entry is None:
            return False
        self.bytes_used += nbytes - entry.nbytes
        entry.nbytes = nbytes
        return True

    def remove(self, block_id: BlockId) -> Entry:
        """Forget one entry from every view (its tails stay: the pool drops them too)."""
        entry = self.by_id.pop(block_id)
        self.bytes_used -= entry.nbytes
        self.children.remove(entry.parent, entry.tokens, entry.media)
        if entry.is_tail:
            self.num_tails -= 1
        else:
            del self.by_hash[entry.block_hash]
        return entry

    def tails_under(self, block_hash: bytes) -> list[BlockId]:
        """The tails hanging right after a full block."""
        return [c for c in self.children.under(block_hash) if self.by_id[c].is_tail]

    def check_invariants(self, block_size: int) -> None:
        """Assert the three views agree (O(all entries); for tests)."""
        assert len(self.by_hash) + self.num_tails == len(self.by_id) == len(self.children)
        for h, block_id in self.by_hash.items():
            assert self.by_id[block_id].block_hash == h and not self.by_id[block_id].is_tail
        for block_id, entry in self.by_id.items():
            assert entry.block_id == block_id < self.next_id
            assert entry.ref_count >= 0 and entry.nbytes >= 0
            assert self.children.get(entry.parent, entry.tokens, entry.media) == block_id
            assert len(entry.tokens) < block_size if entry.is_tail else len(entry.tokens) == block_size
        assert self.bytes_used == sum(e.nbytes for e in self.by_id.values())

    def _new_id(self) -> BlockId:
        block_id = BlockId(self.next_id)
        self.next_id += 1
        return block_id

    def _add(self, entry: Entry) -> Entry:
        self.by_id[entry.block_id] = entry
        self.children.add(entry.parent, entry.tokens, entry.block_id, entry.media)
        return entry
