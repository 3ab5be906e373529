"""The prefix store's arrays, on the MLX thread: full blocks and checkpoints by block id.

The cache manager decides which entries exist; this store only holds their arrays. A full
block is ``block_size`` tokens of every ``kv`` layer's keys and values; a checkpoint (a pool
*tail*) is the rest of a cache at one position: the ``kv`` layers' tokens after the last full
block, the sliding-window layers' last window, the recurrent layers' state
(``worker/prefix/layers.py``). Both are copied out of a sequence's cache when its prompt is
done (and when it finishes), and assembled into a fresh cache to start a sequence that
shares the prefix. With ``cache.disk_dir``, full blocks the pool evicts are written to the
disk tier (``worker/prefix/disk_tier.py``) before they are dropped, and a hit the pool extended
through spilled blocks reads them back; a block the tier no longer has (deleted, bad file)
is recomputed from its tokens, so the hit's cache is exact either way.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from ...core.prefix.block_pool import TAIL_INDEX
from ...core.prefix.pool_types import boundary_of
from ...messages import BlockId, KVReady, NewSequence, RequestId, StepPlan
from .disk_tier import DiskTier, model_identity
from .layers import BlockArrays, CacheLayout, Checkpoint, cache_layout, nbytes_of

logger = logging.getLogger(__name__)

Entry = BlockArrays | Checkpoint


def block_nbytes(block: BlockArrays) -> int:
    return sum(nbytes_of(keys) + nbytes_of(values) for keys, values in block)


def entry_nbytes(entry: Entry) -> int:
    return entry.nbytes if isinstance(entry, Checkpoint) else block_nbytes(entry)


class KVStore:
    """Block and checkpoint arrays by block id. Used only on the MLX thread."""

    def __init__(self) -> None:
        self._entries: dict[BlockId, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._entries

    @property
    def nbytes(self) -> int:
        return sum(entry_nbytes(entry) for entry in self._entries.values())

    def put(self, block_id: BlockId, entry: Entry) -> None:
        self._entries[block_id] = entry

    def get(self, block_id: BlockId) -> Entry:
        return self._entries[block_id]

    def drop(self, block_ids: tuple[BlockId, ...]) -> None:
        for block_id in block_ids:
            self._entries.pop(block_id, None)

    def clear(self) -> None:
        self._entries.clear()


class PrefixBlocks:
    """A runner's side of the prefix cache: the store, plus the copies awaiting a verdict.

    When a sequence's KV is ready (prompt processed, or sequence finished) the runner hands
    its cache to :meth:`ready`, which copies the new full blocks and a checkpoint and reports
    a :class:`KVReady`; the cache manager answers through a later plan (``store_blocks`` /
    ``released_ready_ids``), and the copies it did not keep are freed then.
    """

    def __init__(
        self,
        model: Any,
        block_size: int,
        *,
        enabled: bool,
        kv_bits: int | None = None,
        kv_group_size: int = 64,
        disk_dir: str | None = None,
        disk_mb: int = 0,
        snapshot_blocks: int = 0,
    ):
        self.layout: CacheLayout = cache_layout(model, kv_bits=kv_bits, kv_group_size=kv_group_size)
        if enabled and not self.layout.cachable:
            logger.warning(
                "prefix cache off for this model: its cache layers cannot be cached (%s); serving uncached",
                ", ".join(self.layout.unsupported),
            )
        self.enabled = enabled and self.layout.cachable
        self.block_size = block_size
        self.store = KVStore()
        self._model = model
        # ready_id -> (first block, block copies, checkpoint copy or None, boundary snapshots)
        self._pending: dict[int, tuple[int, list[BlockArrays], Checkpoint | None, list[Checkpoint]]] = {}
        #: Tokens between the snapshots of sliding-window / recurrent layers taken inside a
        #: prefill (0: none; only for models whose blocks cannot end a hit themselves).
        self.snapshot_every = snapshot_blocks * block_size if self.needs_exact_checkpoints else 0
        self._snapshots: dict[RequestId, list[Checkpoint]] = {}  # taken, not yet reported
        #: A model without attention layers: the boundaries a request's prefill has yet to
        #: reach, in order (its cache cannot say where it stands; the runner stops at each).
        self._boundaries_ahead: dict[RequestId, list[int]] = {}
        self._recomputed: dict[RequestId, int] = {}  # hit tokens recomputed, not yet reported
        self._next_ready_id = 0
        self.disk: DiskTier | None = None
        if enabled and disk_dir is not None:  # also when uncachable: other models' files go
            identity = model_identity(model, self.layout.kinds, block_size)
            self.disk = DiskTier(disk_dir, disk_mb * 1024 * 1024, identity)
        # live request -> how many of its leading full blocks the pool has (its hit's, then
        # those it reported): a later ready copies from there, whatever the runner guessed
        self._known_blocks: dict[RequestId, int] = {}

    @classmethod
    def from_config(cls, model: Any, cfg: Any) -> PrefixBlocks:
        """The store for a ``[cache]`` section (``CacheConfig``)."""
        return cls(
            model,
            cfg.block_size,
            enabled=cfg.enabled,
            kv_bits=cfg.kv_bits,
            kv_group_size=cfg.kv_group_size,
            disk_dir=cfg.disk_dir,
            disk_mb=cfg.disk_mb,
            snapshot_blocks=cfg.state_snapshot_blocks,
        )

    @property
    def needs_exact_checkpoints(self) -> bool:
        """Whether a checkpoint must be taken where the cache is (sliding-window or recurrent
        layers): a runner whose cache has run past the prompt calls :meth:`snapshot` earlier."""
        return self.enabled and not self.layout.blocks_end_hits

    def apply(self, plan: StepPlan) -> None:
        """Keep the copies the plan names, free the rest of their commits, drop evicted entries."""
        for store in plan.store_blocks:
            first_block, copies, checkpoint, snapshots = self._pending[store.ready_id]
            boundary = boundary_of(store.block_index)
            if boundary is not None:
                self.store.put(store.block_id, snapshots[boundary])
            elif store.block_index == TAIL_INDEX:
                assert checkpoint is not None, "a tail the executor checkpointed"
                self.store.put(store.block_id, checkpoint)
            else:
                self.store.put(store.block_id, copies[store.block_index - first_block])
        for ready_id in plan.released_ready_ids:
            self._pending.pop(ready_id, None)
        if self.disk is not None:
            for block_id, block_hash in plan.spill_blocks:
                if block_id in self.store:
                    self.disk.spill(block_hash, self.store.get(block_id))
            if plan.clear_disk:
                self.disk.clear()
        self.store.drop(plan.drop_blocks)
        for request_id in plan.finished_ids:
            self._known_blocks.pop(request_id, None)
            self._snapshots.pop(request_id, None)
            self._boundaries_ahead.pop(request_id, None)

    def cache_for(self, seq: NewSequence) -> list[Any] | None:
        """A cache holding the sequence's ``num_cached_tokens`` cached tokens, or None for none."""
        self._known_blocks[seq.request_id] = 0
        self._snapshots.pop(seq.request_id, None)  # a preempted run's
        if not seq.cached_block_ids:
            return None
        missing = self._read_back(seq.disk_blocks)
        if missing is not None:
            return self._recompute_from(seq, missing)
        entries = [self.store.get(block_id) for block_id in seq.cached_block_ids]
        checkpoint = entries[-1] if isinstance(entries[-1], Checkpoint) else None
        blocks = entries[:-1] if checkpoint is not None else entries
        self._known_blocks[seq.request_id] = seq.num_cached_tokens // self.block_size
        assert all(not isinstance(block, Checkpoint) for block in blocks), "one tail, at the end"
        return self.layout.build(self._model, blocks, checkpoint, seq.num_cached_tokens)

    def _read_back(self, disk_blocks: tuple[tuple[BlockId, bytes], ...]) -> int | None:
        """Put the spilled blocks of a hit back in the store; the position in ``disk_blocks``
        of the first the disk tier cannot give (None: all came back)."""
        for index, (block_id, block_hash) in enumerate(disk_blocks):
            block = None if self.disk is None else self.disk.load(block_hash)
            if block is None:
                return index
            self.store.put(block_id, block)
        return None

    def _recompute_from(self, seq: NewSequence, missing: int) -> list[Any]:
        """The hit's cache when a spilled block is gone: the blocks before it from the store,
        the rest of the ``num_cached_tokens`` recomputed (a model whose blocks spill is all
        KV, so a prefill of those tokens is exact), and the missing blocks stored again."""
        block_ids = seq.cached_block_ids
        first_missing = block_ids.index(seq.disk_blocks[missing][0])
        blocks = [self.store.get(block_id) for block_id in block_ids[:first_missing]]
        start = first_missing * self.block_size
        cache = self.layout.build(self._model, blocks, None, start) if blocks else make_prompt_cache(self._model)
        self._model(mx.array(seq.prompt_token_ids[start : seq.num_cached_tokens], dtype=mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])
        for block_id, _ in seq.disk_blocks[missing:]:
            index = block_ids.index(block_id)
            self.store.put(block_id, self.layout.cut_blocks(cache, index, 1, self.block_size)[0])
        self._known_blocks[seq.request_id] = seq.num_cached_tokens // self.block_size
        self._recomputed[seq.request_id] = seq.num_cached_tokens - start
        return cache

    def read_back_whole(self, seq: NewSequence) -> bool:
        """Put a hit's spilled blocks back in the store, for a runner that cannot recompute part
        of a hit from token ids alone (media prompts): False when one is gone, and the whole hit
        is then reported recomputed (the runner prefills the prompt from its start)."""
        if not seq.disk_blocks or self._read_back(seq.disk_blocks) is None:
            return True
        self._recomputed[seq.request_id] = seq.num_cached_tokens
        return False

    def take_recomputed(self) -> tuple[tuple[RequestId, int], ...]:
        """(request, tokens of its hit recomputed) since the last call: ``StepResult.recomputed``."""
        recomputed, self._recomputed = tuple(self._recomputed.items()), {}
        return recomputed

    def boundaries(self, seq: NewSequence) -> tuple[int, ...]:
        """Where the sequence's prefill stops to snapshot its sliding-window and recurrent
        layers: every ``snapshot_every`` tokens after its hit, before its last prompt token."""
        every = self.snapshot_every
        if not every:
            return ()
        first = seq.num_cached_tokens // every * every + every
        boundaries = tuple(range(first, len(seq.prompt_token_ids) - 1, every))
        if not self.layout.knows_position:
            self._boundaries_ahead[seq.request_id] = list(boundaries)
        return boundaries

    def prompt_segments(self, seq: NewSequence) -> list[list[int]]:
        """The uncached prompt cut at :meth:`boundaries` (mlx-lm's ``BatchGenerator`` ends a
        prefill chunk at every segment's end; report it with :meth:`at_boundary`)."""
        ids = seq.prompt_token_ids
        cuts = [seq.num_cached_tokens, *self.boundaries(seq), len(ids)]
        return [list(ids[start:end]) for start, end in zip(cuts, cuts[1:], strict=False)]

    def at_boundary(self, request_id: RequestId, cache: list[Any]) -> None:
        """The sequence's cache stands at one of its boundaries: snapshot it for its next
        :meth:`ready` (which reports it as ``KVReady.boundary_at``)."""
        position = self.layout.position(cache)
        if position is None:  # recurrent layers only: the next boundary its prefill was to reach
            ahead = self._boundaries_ahead.get(request_id)
            if not ahead:
                return
            position = ahead.pop(0)
        self._snapshots.setdefault(request_id, []).append(self.layout.checkpoint(cache, position, self.block_size))

    def prefill_to_boundaries(self, seq: NewSequence, cache: list[Any], step_size: int) -> int:
        """Simple mode: prefill ``cache`` up to the sequence's last boundary, snapshotting at
        each; the position reached (``num_cached_tokens`` when there is none)."""
        position = seq.num_cached_tokens
        for boundary in self.boundaries(seq):
            while position < boundary:
                n = min(step_size, boundary - position)
                chunk = mx.array(seq.prompt_token_ids[position : position + n], dtype=mx.uint32)[None]
                self._model(chunk, cache=cache)
                mx.eval([c.state for c in cache])
                position += n
            self.at_boundary(seq.request_id, cache)
        return position

    def snapshot(self, cache: list[Any], num_tokens: int) -> Checkpoint | None:
        """A checkpoint of a cache that holds exactly ``num_tokens`` tokens now, for a later
        :meth:`ready` (None when the cache is off or ``num_tokens`` is 0)."""
        if not self.enabled or num_tokens <= 0:
            return None
        assert self.layout.position(cache) in (num_tokens, None)
        return self.layout.checkpoint(cache, num_tokens, self.block_size)

    def ready(
        self,
        request_id: RequestId,
        token_ids: tuple[int, ...],
        cache: list[Any],
        first_block: int,
        checkpoint: Checkpoint | None = None,
        *,
        position: int | None = None,
    ) -> KVReady | None:
        """Copy the new full blocks of ``token_ids`` (from ``first_block`` on) out of ``cache``,
        which holds the KV of at least a prefix of them, and a checkpoint: at the cache's
        position (or ``checkpoint``, taken earlier by :meth:`snapshot`) when the model has
        sliding-window or recurrent layers, else after as many of ``token_ids`` as it holds (a
        hit may use a KV tail in part: an exact repeat reuses all but its last token).
        ``position``: where the cache stands, from a runner that knows, for a cache that cannot
        tell (recurrent layers only; ignored for the others)."""
        if not self.enabled:
            return None
        told, position = position, self.layout.position(cache)
        exact = position is not None or told is not None
        if position is None:  # recurrent layers only: where the runner or a snapshot says
            position = told if told is not None else self._snapshot_position(request_id, checkpoint)
            if position is None:
                return None
        first_block = min(first_block, self._known_blocks.get(request_id, first_block))
        num_blocks = min(len(token_ids), position) // self.block_size - first_block
        if request_id in self._known_blocks:
            self._known_blocks[request_id] = first_block + max(0, num_blocks)
        if checkpoint is None and exact:
            checkpoint = self._checkpoint(token_ids, cache, position)
        if checkpoint is not None and checkpoint.num_tokens > len(token_ids):
            checkpoint = None
        reach = min(len(token_ids), position)
        snapshots = [s for s in self._snapshots.pop(request_id, ()) if s.num_tokens <= reach]
        if num_blocks <= 0 and checkpoint is None:
            return None
        token_ids = token_ids[: max(position, 0 if checkpoint is None else checkpoint.num_tokens)]
        copies = self.layout.cut_blocks(cache, first_block, max(0, num_blocks), self.block_size)
        return self._pend(request_id, token_ids, first_block, copies, checkpoint, snapshots)

    def _pend(
        self,
        request_id: RequestId,
        token_ids: tuple[int, ...],
        first_block: int,
        copies: list[BlockArrays],
        checkpoint: Checkpoint | None,
        snapshots: list[Checkpoint],
    ) -> KVReady:
        """Hold the copies until the cache manager says which to keep; what it is told of them."""
        ready_id = self._next_ready_id
        self._next_ready_id += 1
        self._pending[ready_id] = (first_block, copies, checkpoint, snapshots)
        return KVReady(
            request_id=request_id,
            ready_id=ready_id,
            token_ids=token_ids,
            first_block=first_block,
            block_nbytes=tuple(block_nbytes(copy) for copy in copies),
            tail_at=None if checkpoint is None else checkpoint.num_tokens,
            tail_nbytes=0 if checkpoint is None else checkpoint.nbytes,
            blocks_end_hits=self.layout.blocks_end_hits,
            boundary_at=tuple(s.num_tokens for s in snapshots),
            boundary_nbytes=tuple(s.nbytes for s in snapshots),
        )

    def _snapshot_position(self, request_id: RequestId, checkpoint: Checkpoint | None) -> int | None:
        """Where a cache that cannot tell its position was last snapshotted: the runner's
        checkpoint, else the request's last boundary snapshot (None: nowhere)."""
        if checkpoint is not None:
            return checkpoint.num_tokens
        return max((s.num_tokens for s in self._snapshots.get(request_id, ())), default=None)

    def _checkpoint(self, token_ids: tuple[int, ...], cache: list[Any], position: int) -> Checkpoint | None:
        """The checkpoint worth keeping from a cache at ``position`` (None: none is)."""
        if not self.layout.blocks_end_hits:  # only where the cache is
            at = position if position <= len(token_ids) else 0
        else:  # a KV tail can be cut anywhere and used in part; a block-aligned one adds nothing
            at = min(position, len(token_ids))
            at = 0 if at % self.block_size == 0 else at
        return self.layout.checkpoint(cache, at, self.block_size) if at > 0 else None

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
        self._known_blocks.clear()
        self._snapshots.clear()
        self._boundaries_ahead.clear()
        self._recomputed.clear()
        self._pending.clear()
        self.store.clear()
