"""A batch KV cache whose rows hold only their suffix after a prefix held once.

:class:`SharedPrefix` is a run of the prefix store's full blocks, assembled once (one copy per batch, not one per
row) for every plain KV layer. :class:`CascadeBatchKVCache` is mlx-lm's ``BatchKVCache`` for one such layer: its
keys and values are the rows' suffixes, left-padded as usual (so the inherited update, mask, trim, padding and
filter work unchanged), and each row ``i`` uses the first ``shared[i]`` tokens of the prefix (0: none; the prefix
may be longer than a row's hit). ``offset`` counts the shared tokens too, so RoPE places every token where it is
in its row's sequence. ``extract`` gives a row's whole cache back (prefix part included), as mlx-lm's does.

A row enters as a :class:`SharedRowCache` (the suffix of one sequence, and which prefix it uses): mlx-lm merges
the rows of an insert with the first row's ``merge`` and grows the running batch with ``extend``. Two parts whose
prefixes differ are brought to one: the longer where one extends the other, else the one more rows' tokens use;
the other part's rows keep the common tokens shared and take the rest into their suffix (:func:`_rebased`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


@attrs.define(eq=False, slots=True)
class SharedPrefix:
    """``len(block_ids) * block_size`` tokens of every plain KV layer, held once: ``keys[k]``/``values[k]`` of the
    k-th KV layer, (1, heads, tokens, dim)."""

    block_ids: tuple[Any, ...]
    block_size: int
    keys: list[mx.array]
    values: list[mx.array]

    @property
    def length(self) -> int:
        return len(self.block_ids) * self.block_size

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))

    def common_tokens(self, other: SharedPrefix | None) -> int:
        """Tokens both prefixes start with (same blocks, so the same keys and values)."""
        if other is None:
            return 0
        if other is self:
            return self.length
        common = 0
        for a, b in zip(self.block_ids, other.block_ids, strict=False):
            if a != b:
                break
            common += 1
        return common * self.block_size


class SharedRowCache(KVCache):
    """One sequence's plain KV layer entering the batch: its keys and values after the first ``shared`` tokens of
    ``prefix`` (its ``offset`` counts the suffix only)."""

    def __init__(self, prefix: SharedPrefix | None, kv_index: int, shared: int):
        super().__init__()
        self.prefix = prefix if shared > 0 else None
        self.kv_index = kv_index
        self.shared = shared if self.prefix is not None else 0

    @classmethod
    def of(cls, full: KVCache | None, prefix: SharedPrefix | None, kv_index: int, shared: int) -> SharedRowCache:
        """The row cache of a sequence whose whole cache is ``full`` (None: empty), past ``shared`` tokens of
        ``prefix`` (a copy of its suffix: the full cache is let go)."""
        row = cls(prefix, kv_index, shared)
        if full is not None and full.offset > row.shared:
            end = full.offset
            row.keys = mx.contiguous(full.keys[..., row.shared : end, :])
            row.values = mx.contiguous(full.values[..., row.shared : end, :])
            row.offset = end - row.shared
        return row

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> CascadeBatchKVCache:
        return CascadeBatchKVCache.merge(caches)


class CascadeBatchKVCache(BatchKVCache):
    """mlx-lm's batch cache of one plain KV layer, its rows' suffixes only, with the prefix they share."""

    def __init__(self, left_padding: list[int], prefix: SharedPrefix | None = None, kv_index: int = 0, shared=None):
        super().__init__(left_padding)
        self.prefix = prefix
        self.kv_index = kv_index
        self._shared = list(shared) if shared is not None else [0] * len(left_padding)
        self.offset = self.offset + mx.array(self._shared)
        #: Calls that took the cascade path (the support probe counts them).
        self.cascade_calls = 0
        self._reset_views()

    # -- what attention reads ------------------------------------------------------------------------------------

    def _reset_views(self) -> None:
        if self.prefix is not None and not any(self._shared):
            self.prefix = None  # no row uses it any more: let it go
        self.cascade_prefix = None if self.prefix is None else self._prefix_arrays()
        whole = self.prefix is not None and all(n == self.prefix.length for n in self._shared)
        self.cascade_shared = None if whole or self.prefix is None else mx.array(self._shared, dtype=mx.int32)

    def _prefix_arrays(self) -> tuple[mx.array, mx.array]:
        assert self.prefix is not None
        used = max(self._shared)  # the tokens past every row's share are never read
        keys, values = self.prefix.keys[self.kv_index], self.prefix.values[self.kv_index]
        if used == keys.shape[2]:
            return keys, values
        return keys[..., :used, :], values[..., :used, :]

    @property
    def shared(self) -> list[int]:
        return list(self._shared)

    @property
    def prefix_nbytes(self) -> int:
        """Bytes of this layer's part of the prefix (0: none)."""
        if self.prefix is None:
            return 0
        return self.prefix.keys[self.kv_index].nbytes + self.prefix.values[self.kv_index].nbytes

    @property
    def shared_bytes_saved(self) -> int:
        """Bytes the rows would hold beyond this layer's one prefix if each had its own copy."""
        if self.prefix is None:
            return 0
        keys, values = self.cascade_prefix
        per_token = (keys.nbytes + values.nbytes) // max(1, keys.shape[2])
        return per_token * (sum(self._shared) - keys.shape[2])

    # -- batch bookkeeping ---------------------------------------------------------------------------------------

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> CascadeBatchKVCache:
        rows = [_as_row(c) for c in caches]
        prefix = _chosen_prefix([(r.prefix, r.shared) for r in rows])
        rows = [_rebased_row(r, prefix) for r in rows]
        plain = BatchKVCache.merge(rows)
        out = cls([0] * len(rows), prefix, rows[0].kv_index if rows else 0, [r.shared for r in rows])
        out.keys, out.values, out._idx = plain.keys, plain.values, plain._idx
        out.left_padding = plain.left_padding
        out.offset = plain.offset + mx.array(out._shared)
        out._reset_views()
        return out

    def extend(self, other: Any) -> None:
        other = other if isinstance(other, CascadeBatchKVCache) else _as_cascade(other, self.kv_index)
        prefix = _chosen_prefix([(self.prefix, n) for n in self._shared] + [(other.prefix, n) for n in other._shared])
        for part in (self, other):
            if part.prefix is not prefix:
                _rebase(part, prefix)
        super().extend(other)
        self._shared += other._shared
        self.prefix = prefix
        self._reset_views()

    def filter(self, batch_indices: Any) -> None:
        super().filter(batch_indices)
        indices = batch_indices.tolist() if isinstance(batch_indices, mx.array) else list(batch_indices)
        self._shared = [self._shared[i] for i in indices]
        self._reset_views()

    def extract(self, idx: int) -> KVCache:
        suffix = super().extract(idx)
        shared = self._shared[idx]
        if shared == 0:
            return suffix
        assert self.prefix is not None
        cache = KVCache()
        parts_k = [self.prefix.keys[self.kv_index][..., :shared, :]]
        parts_v = [self.prefix.values[self.kv_index][..., :shared, :]]
        if suffix.keys is not None:
            parts_k.append(suffix.keys)
            parts_v.append(suffix.values)
        cache.keys = mx.concatenate(parts_k, axis=2)
        cache.values = mx.concatenate(parts_v, axis=2)
        cache.offset = cache.keys.shape[2]
        return cache


def _as_row(cache: Any) -> SharedRowCache:
    """A row cache for merging: a plain ``KVCache`` row shares nothing."""
    if isinstance(cache, SharedRowCache):
        return cache
    return SharedRowCache.of(cache if cache.keys is not None else None, None, 0, 0)


def _as_cascade(batch: BatchKVCache, kv_index: int) -> CascadeBatchKVCache:
    """A plain batch cache's rows as a cascade part that shares nothing."""
    out = CascadeBatchKVCache([0] * batch.offset.shape[0], None, kv_index)
    out.keys, out.values, out._idx = batch.keys, batch.values, batch._idx
    out.left_padding, out.offset = batch.left_padding, batch.offset
    out._reset_views()
    return out


def _chosen_prefix(uses: list[tuple[SharedPrefix | None, int]]) -> SharedPrefix | None:
    """The prefix a merged batch keeps: the one whose rows' shared tokens (kept under it) add up to the most."""
    candidates = {id(p): p for p, n in uses if p is not None and n > 0}
    if not candidates:
        return None
    return max(
        candidates.values(),
        key=lambda c: (sum(min(n, c.common_tokens(p)) for p, n in uses), c.length),
    )


def _rebased_row(row: SharedRowCache, prefix: SharedPrefix | None) -> SharedRowCache:
    """``row`` sharing only what its prefix has in common with ``prefix`` (the rest moves into its suffix)."""
    if row.prefix is prefix or row.prefix is None:
        return row
    keep = min(row.shared, row.prefix.common_tokens(prefix))
    if keep == row.shared:
        rebased = SharedRowCache(prefix, row.kv_index, keep)
        rebased.keys, rebased.values, rebased.offset = row.keys, row.values, row.offset
        return rebased
    whole = KVCache()
    keys = [row.prefix.keys[row.kv_index][..., : row.shared, :]]
    values = [row.prefix.values[row.kv_index][..., : row.shared, :]]
    if row.keys is not None:
        keys.append(row.keys[..., : row.offset, :])
        values.append(row.values[..., : row.offset, :])
    whole.keys, whole.values = mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2)
    whole.offset = whole.keys.shape[2]
    return SharedRowCache.of(whole, prefix, row.kv_index, keep)


def _rebase(part: CascadeBatchKVCache, prefix: SharedPrefix | None) -> None:
    """Move ``part``'s rows onto ``prefix`` in place (through their whole caches: rare, a group changing)."""
    if part.prefix is None or all(n == 0 for n in part._shared):
        part.prefix = prefix
        return
    rows = [
        SharedRowCache.of(part.extract(i), prefix, part.kv_index, min(n, part.prefix.common_tokens(prefix)))
        for i, n in enumerate(part._shared)
    ]
    merged = CascadeBatchKVCache.merge(rows)
    part.keys, part.values, part._idx = merged.keys, merged.values, merged._idx
    part.left_padding, part.offset = merged.left_padding, merged.offset
    part._shared, part.prefix = merged._shared, merged.prefix
    part._reset_views()
