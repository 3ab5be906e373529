"""CacheManagerActor: owns the paged prefix store, consulted once per admission, commit,
release and clear, never per token.

The block pool (``core/prefix/block_pool.py``) decides which blocks exist, who leases them and what
is evicted; the arrays live on the MLX thread, so every answer that creates or evicts blocks
names them for the scheduler to put in the next plan.
"""

from __future__ import annotations

import pathlib
from typing import assert_never

import attrs
import trio

from ...config import CacheConfig
from ...core.memory import available_memory_bytes
from ...core.prefix.block_pool import DISK_BLOCK_SUFFIX as DISK_SUFFIX
from ...core.prefix.block_pool import BlockPool, Budget, PoolStats
from ...core.prefix.pool_types import BlockInfo, boundary_store_index
from ...messages import (
    BlockId,
    CacheCommand,
    CacheReply,
    PrefixClear,
    PrefixCleared,
    PrefixCommit,
    PrefixLookup,
    PrefixMatch,
    PrefixRelease,
    PrefixReleased,
    PrefixStored,
)
from .kv_events import KVEventSink, NoKVEvents


@attrs.frozen(slots=True, kw_only=True)
class CacheStatistics:
    """Counters since start, and the pool's gauges."""

    enabled: bool
    num_queries: int
    num_hits: int
    num_prefix_hits: int
    num_misses: int
    num_commits: int
    num_releases: int
    num_leased: int
    pool: PoolStats


def cache_budget(cfg: CacheConfig) -> Budget:
    """The pool's limit: bytes (memory_mb, else memory_percent of what is available) or blocks."""
    if not cfg.memory_aware:
        return Budget(max_blocks=cfg.max_entries)
    if cfg.memory_mb is not None:
        return Budget(max_bytes=cfg.memory_mb * 1024 * 1024)
    return Budget(max_bytes=int(available_memory_bytes() * cfg.memory_percent))


def remember_disk_blocks(pool: BlockPool, directory: pathlib.Path) -> None:
    """Tell the pool which blocks the disk tier holds, least recently used first. The runner's
    tier has opened the directory by now (the model loads before the cache manager starts)
    and deleted every file that is not this model's or cannot be read."""
    if not directory.is_dir():
        return
    found = []
    for path in directory.glob(f"*{DISK_SUFFIX}"):
        try:
            block_hash = bytes.fromhex(path.name.removesuffix(DISK_SUFFIX))
            stat = path.stat()
        except (ValueError, OSError):  # not a block's name, or deleted meanwhile
            continue
        found.append((stat.st_mtime_ns, block_hash, stat.st_size))
    for _, block_hash, size in sorted(found):
        pool.remember_on_disk(block_hash, size)


class CacheManagerActor:
    """Answers every command, in order, on ``reply_send``. Its block pool is its own: outside
    the actor it is seen only as snapshots (:meth:`statistics`, :meth:`blocks`)."""

    def __init__(
        self,
        *,
        command_recv: trio.MemoryReceiveChannel[CacheCommand],
        reply_send: trio.MemorySendChannel[CacheReply],
        cfg: CacheConfig | None = None,
        kv_events: KVEventSink | None = None,
    ):
        cfg = cfg or CacheConfig()
        self._command_recv = command_recv
        self._reply_send = reply_send
        self._enabled = cfg.enabled
        disk_budget = cfg.disk_mb * 1024 * 1024 if cfg.disk_dir is not None else None
        self._pool = BlockPool(block_size=cfg.block_size, budget=cache_budget(cfg), disk_budget=disk_budget)
        if cfg.enabled and cfg.disk_dir is not None:
            remember_disk_blocks(self._pool, pathlib.Path(cfg.disk_dir))
        self._leased: set[str] = set()
        self._num_commits = 0
        self._num_releases = 0
        #: Where stored and evicted blocks are told (vLLM's KV events for a router), if anywhere.
        self._kv_events = kv_events or NoKVEvents()

    @property
    def block_size(self) -> int:
        return self._pool.block_size

    def statistics(self) -> CacheStatistics:
        pool = self._pool.stats()
        return CacheStatistics(
            enabled=self._enabled,
            num_queries=pool.num_queries,
            num_hits=pool.num_hits,
            num_prefix_hits=pool.num_prefix_hits,
            num_misses=pool.num_misses,
            num_commits=self._num_commits,
            num_releases=self._num_releases,
            num_leased=len(self._leased),
            pool=pool,
        )

    def blocks(self) -> tuple[BlockInfo, ...]:
        """A snapshot of every cached block and tail, by id (O(blocks): for benchmarks and tests)."""
        pool = self._pool
        return tuple(pool.block_info(block_id) for block_id in range(pool.next_id) if block_id in pool)

    def check_invariants(self) -> None:
        """Assert the pool's bookkeeping is consistent (O(blocks); for tests)."""
        self._pool.check_invariants()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve commands until the scheduler closes its end."""
        with self._command_recv, self._reply_send:
            task_status.started()
            try:
                async for command in self._command_recv:
                    reply = self._handle(command)
                    self._kv_events.flush()
                    await self._reply_send.send(reply)
            finally:
                self._kv_events.close()

    def _handle(self, command: CacheCommand) -> CacheReply:
        match command:
            case PrefixLookup():
                self._leased.add(command.request_id)
                if not self._enabled:
                    return PrefixMatch(request_id=command.request_id, num_cached_tokens=0, block_ids=())
                hit = self._pool.lookup(
                    command.request_id, command.prompt_token_ids, command.extra_keys, command.media_keys
                )
                return PrefixMatch(
                    request_id=command.request_id,
                    num_cached_tokens=hit.num_cached_tokens,
                    block_ids=hit.block_ids,
                    disk_blocks=hit.disk_blocks,
                )
            case PrefixCommit():
                return self._commit(command)
            case PrefixRelease():
                return self._release(command.request_ids)
            case PrefixClear():
                return PrefixCleared(evicted=self._told_removed(self._pool.clear()))
            case _:
                assert_never(command)

    def _commit(self, command: PrefixCommit) -> PrefixStored:
        """Create the new blocks (and tail), keep the executor's copies of them, evict over budget."""
        self._num_commits += 1
        if not self._enabled or command.request_id not in self._leased:
            return PrefixStored(request_id=command.request_id, ready_id=command.ready_id)
        store = self._store(command)
        return PrefixStored(
            request_id=command.request_id,
            ready_id=command.ready_id,
            store=store,
            evicted=self._evict(),
            spilled=self._pool.take_spilled(),
        )

    def _store(self, command: PrefixCommit) -> tuple[tuple[int, BlockId], ...]:
        """The store point: the pool's new entries for a commit, as (copy index, id) pairs."""
        new = self._pool.commit(
            command.request_id,
            command.token_ids,
            command.extra_keys,
            command.media_keys,
            tail_at=command.tail_at,
            blocks_end_hits=command.blocks_end_hits,
            boundary_at=command.boundary_at,
        )
        store = []
        for block in new:
            if block.is_tail and block.token_end != command.tail_at:  # a boundary snapshot
                k = command.boundary_at.index(block.token_end)
                self._pool.set_nbytes(block.block_id, command.boundary_nbytes[k])
                store.append((boundary_store_index(k), block.block_id))
                continue
            if block.is_tail:
                self._pool.set_nbytes(block.block_id, command.tail_nbytes)
            else:
                copy_index = block.block_index - command.first_block
                assert 0 <= copy_index < len(command.block_nbytes), "a new block the executor copied"
                self._pool.set_nbytes(block.block_id, command.block_nbytes[copy_index])
            store.append((block.block_index, block.block_id))
        full_blocks = [block.block_id for block in new if not block.is_tail]  # the router knows blocks only
        self._kv_events.stored(self._pool, command.token_ids, command.extra_keys, full_blocks, command.media_keys)
        return tuple(store)

    def _evict(self) -> tuple[BlockId, ...]:
        """The evict point: entries dropped to get back under budget (a clear drops the
        unleased rest in ``_handle``'s ``PrefixClear``)."""
        return self._told_removed(self._pool.evict_over_budget())

    def _told_removed(self, evicted: tuple[BlockId, ...]) -> tuple[BlockId, ...]:
        """Publish the removal of ``evicted`` (KV events) and pass them on."""
        self._kv_events.removed(evicted)
        return evicted

    def _release(self, request_ids: tuple) -> PrefixReleased:
        """End the leases; blocks they held may now be evicted if the store is over budget."""
        self._pool.release(request_ids)
        for request_id in request_ids:
            if request_id in self._leased:
                self._leased.discard(request_id)
                self._num_releases += 1
        return PrefixReleased(evicted=self._evict(), spilled=self._pool.take_spilled())
