"""Who leases which prefix-cache entries, and the LRU free queue of the unleased. Pure.

A request *leases* the entries it looks up or commits; an entry's ``ref_count`` is the number
of requests leasing it. Unleased entries stay cached in the free queue, least recently used
first, and the pool evicts from its front.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from ..plan import BlockId, RequestId
from .pool_entries import Entry, EntryTable


class Leases:
    """Per-request ordered lease sets, ref counts (kept on the entries) and the free queue."""

    def __init__(self, table: EntryTable) -> None:
        self._table = table
        self._leases: dict[RequestId, dict[BlockId, None]] = {}  # ordered sets
        #: unleased entries; the front is evicted first
        self.free: collections.OrderedDict[BlockId, None] = collections.OrderedDict()
        self.num_shared = 0

    def lease(self, request_id: RequestId, block_id: BlockId) -> None:
        """Lease an entry to a request (once: a second lease by it is a no-op)."""
        lease = self._leases.setdefault(request_id, {})
        if block_id in lease:
            return
        lease[block_id] = None
        entry = self._table[block_id]
        entry.ref_count += 1
        if entry.ref_count == 1:
            self.free.pop(block_id, None)  # an entry just created was never free
        elif entry.ref_count == 2:
            self.num_shared += 1

    def release(self, request_ids: Iterable[RequestId]) -> None:
        """End these requests' leases; unknown or already released requests are skipped.

        Entries left unleased join the back of the free queue (most recently used). Among the
        entries freed by one call, deeper ones (higher ``block_index``, a sequence's tail) are
        queued first, a tail before the full block at its depth, so they are evicted before
        the heads that other prompts may share.
        """
        freed: list[Entry] = []
        for request_id in request_ids:
            for block_id in self._leases.pop(request_id, ()):
                entry = self._table[block_id]
                entry.ref_count -= 1
                if entry.ref_count == 1:
                    self.num_shared -= 1
                elif entry.ref_count == 0:
                    freed.append(entry)
        freed.sort(key=lambda e: (e.block_index, e.is_tail), reverse=True)  # stable
        for entry in freed:
            self.free[entry.block_id] = None

    def holders(self, request_id: RequestId) -> tuple[BlockId, ...]:
        """The entries a request leases, in the order it got them; () if none."""
        return tuple(self._leases.get(request_id, ()))

    def check_invariants(self) -> None:
        """Assert leases, ref counts and the free queue agree (O(all entries); for tests)."""
        entries = self._table.by_id
        leased = collections.Counter(b for lease in self._leases.values() for b in lease)
        assert all(self._leases.values()), "empty lease kept"
        assert set(leased) <= set(entries), "lease of a block that is not cached"
        for block_id, entry in entries.items():
            assert entry.ref_count == leased[block_id], "ref_count != number of leases"
            assert (entry.ref_count == 0) == (block_id in self.free), "free queue != unleased"
        assert set(self.free) <= set(entries)
        assert self.num_shared == sum(1 for e in entries.values() if e.ref_count > 1)
