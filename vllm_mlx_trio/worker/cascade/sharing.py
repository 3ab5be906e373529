"""Which rows of the running batch share a prefix, on the batched runner's side (``cache.share_prefix_in_batch``).

A row entering mlx-lm's generator with a prefix-store hit shares the hit's full blocks with the batch's group (a
:class:`~.batch_cache.SharedPrefix`, assembled once from the store's blocks) as far as its blocks are the group's;
it keeps only the rest of its cache (:class:`~.batch_cache.SharedRowCache`). With no group in the batch, the
row's own blocks start one; a row whose blocks share fewer than ``cache.share_prefix_min_tokens`` with the batch's group
holds its whole cache, as without sharing. A row whose blocks extend the group's makes the group longer (the
others keep using its first tokens). The group lives while a row uses it (a weak reference here).

Only plain KV layers share; a model's sliding-window and recurrent layers keep their per-row state. Whether the
model's attention runs through the cascade dispatch exactly is probed once at load (:func:`probe`): a model whose
attention is computed otherwise (MLA, attention sinks) serves unshared, and :attr:`InBatchSharing.status` says why.
"""

from __future__ import annotations

import copy
import logging
import weakref
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from ..prefix.layers import Checkpoint, unpack
from .attention import install
from .batch_cache import CascadeBatchKVCache, SharedPrefix, SharedRowCache

logger = logging.getLogger(__name__)

#: Probe shapes: prefix and suffix tokens of its two rows (small: it runs at load).
_PROBE_PREFIX, _PROBE_SUFFIXES = 8, (3, 1)
#: Largest relative difference (norm) of the probe's logits, shared vs plain: float32 computes both to its rounding
#: (1e-6 measured); bf16/fp16 models round each layer's output to 8-11 bits (1-2 % measured on the demo models).
#: A model whose attention the dispatch gets wrong differs by far more (its rows miss or double the prefix).
_PROBE_TOLERANCE_F32, _PROBE_TOLERANCE_HALF = 1e-4, 0.05


class InBatchSharing:
    """Turns the caches of rows entering the batch into shared-prefix row caches; reports what sharing saves."""

    def __init__(self, model: Any, prefix_blocks: Any, *, requested: bool, min_tokens: int = 1):
        self._model = model
        #: Fewest shared tokens for a row to join the batch's group; fewer: it holds its whole cache.
        self._min_tokens = min_tokens
        self._blocks = prefix_blocks
        self._kinds = prefix_blocks.layout.kinds
        self._group: weakref.ReferenceType[SharedPrefix] | None = None
        #: Rows that entered the batch sharing a prefix, and the tokens they shared, since load.
        self.rows_shared = 0
        self.tokens_shared = 0
        #: Tokens each row shares, by request (pruned to the live rows as it grows: :meth:`shared_tokens`).
        self._shared_by_request: dict[Any, int] = {}
        #: The most bytes the batch's KV layers held after a step, and what sharing saved then (:meth:`observe`).
        self.peak_kv_bytes = self.peak_saved_bytes = 0
        self.status = self._support(requested)
        self.active = self.status == "on"
        if requested and not self.active:
            logger.warning("sharing prefixes inside the batch is off for this model: %s", self.status)

    def _support(self, requested: bool) -> str:
        if not requested:
            return "off (cache.share_prefix_in_batch = false)"
        if not self._blocks.enabled:
            return "off (the prefix cache is off for this model)"
        if "kv" not in self._kinds:
            return "off (the model has no plain KV attention layer)"
        return probe(self._model, self._kinds)

    def rows(self, seqs: Sequence[Any], caches: Sequence[list[Any] | None]) -> list[list[Any]]:
        """Each row's cache for the generator: its plain KV layers past the prefix it shares (a fresh one for a
        row with no cache yet, so every batch cache is a cascade one)."""
        out = []
        for seq, cache in zip(seqs, caches, strict=True):
            cache = cache if cache is not None else make_prompt_cache(self._model)
            prefix, shared = self._share_for(seq)
            self._shared_by_request[seq.request_id] = shared
            if shared:
                self.rows_shared += 1
                self.tokens_shared += shared
            out.append(self._row(cache, prefix, shared))
        return out

    def observe(self, batch_cache: Sequence[Any]) -> None:
        """After a step: keep the most KV bytes the running batch held, and what sharing saved then."""
        held, saved = running_kv(batch_cache)
        if held > self.peak_kv_bytes:
            self.peak_kv_bytes, self.peak_saved_bytes = held, saved

    def take_peak(self) -> tuple[int, int]:
        """(most KV bytes the batch held, bytes sharing saved then) since the last call."""
        peak, self.peak_kv_bytes, self.peak_saved_bytes = (self.peak_kv_bytes, self.peak_saved_bytes), 0, 0
        return peak

    def shared_tokens(self, request_ids: Sequence[Any]) -> list[int]:
        """The tokens each of these running rows shares with the batch's prefix (0: none, or not yet in)."""
        if len(self._shared_by_request) > 2 * len(request_ids) + 16:  # rows that left
            live = set(request_ids)
            self._shared_by_request = {r: n for r, n in self._shared_by_request.items() if r in live}
        return [self._shared_by_request.get(rid, 0) for rid in request_ids]

    def _row(self, cache: list[Any], prefix: SharedPrefix | None, shared: int) -> list[Any]:
        row, kv_index = [], 0
        for layer, kind in zip(cache, self._kinds, strict=True):
            if kind == "kv":
                full = layer if layer.keys is not None else None
                row.append(SharedRowCache.of(full, prefix, kv_index, shared))
                kv_index += 1
            else:
                row.append(layer)
        return row

    def _share_for(self, seq: Any) -> tuple[SharedPrefix | None, int]:
        """The group a new row shares, and how many of its tokens."""
        ids = self._hit_blocks(seq)
        size = self._blocks.block_size
        group = self._group() if self._group is not None else None
        if group is not None:
            common = _common_blocks(group.block_ids, ids) * size
            if common < self._min_tokens:
                return None, 0
            if common == group.length and len(ids) > len(group.block_ids):
                group = self._assemble(ids)  # the batch adopts the longer group
            return group, common
        if len(ids) * size < self._min_tokens or not ids:
            return None, 0
        return self._assemble(ids), len(ids) * size

    def _hit_blocks(self, seq: Any) -> tuple[Any, ...]:
        """The full blocks of the row's hit that the store holds (a tail checkpoint is the row's own)."""
        store, full = self._blocks.store, seq.num_cached_tokens // self._blocks.block_size
        ids = []
        for block_id in seq.cached_block_ids[:full]:
            if block_id not in store or isinstance(store.get(block_id), Checkpoint):
                break
            ids.append(block_id)
        return tuple(ids)

    def _assemble(self, ids: tuple[Any, ...]) -> SharedPrefix:
        """The group of these blocks: each KV layer's keys and values, concatenated once."""
        blocks = [self._blocks.store.get(block_id) for block_id in ids]
        num_kv = sum(kind == "kv" for kind in self._kinds)
        keys = [mx.concatenate([unpack(block[k][0]) for block in blocks], axis=2) for k in range(num_kv)]
        values = [mx.concatenate([unpack(block[k][1]) for block in blocks], axis=2) for k in range(num_kv)]
        mx.eval(keys, values)
        group = SharedPrefix(ids, self._blocks.block_size, keys, values)
        self._group = weakref.ref(group)
        return group


def running_kv(batch_cache: Sequence[Any]) -> tuple[int, int]:
    """(bytes the running batch's KV layers hold, bytes more they would hold with a prefix copy per row)."""
    held = saved = 0
    for layer in batch_cache:
        if isinstance(layer, CascadeBatchKVCache):
            saved += layer.shared_bytes_saved
            held += layer.prefix_nbytes  # each layer holds its own part of the prefix
        if isinstance(layer, BatchKVCache):
            held += layer.nbytes
    return held, saved


def _common_blocks(a: Sequence[Any], b: Sequence[Any]) -> int:
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    return common


def probe(model: Any, kinds: Sequence[str]) -> str:
    """Install the dispatch, then check that a cascade batch computes what a plain one does: "on", or why not."""
    install(model)
    try:
        plain, shared, calls, dtype = _probe_logits(model, kinds)
    except Exception as exc:  # a model whose attention takes another shape or mask: unshared
        return f"off (its attention does not take a shared prefix: {type(exc).__name__}: {exc})"
    if calls != sum(kind == "kv" for kind in kinds):
        return "off (some attention layers do not call mlx-lm's scaled_dot_product_attention)"
    error = (mx.linalg.norm(plain - shared) / mx.maximum(mx.linalg.norm(plain), 1e-6)).item()
    if error > (_PROBE_TOLERANCE_F32 if dtype == mx.float32 else _PROBE_TOLERANCE_HALF):
        return "off (its attention with a shared prefix differs from its attention without)"
    return "on"


def _probe_logits(model: Any, kinds: Sequence[str]) -> tuple[mx.array, mx.array, int, mx.Dtype]:
    """The logits of a decode step of two rows over a common prefix (float32): plain batch, shared batch; cascade
    calls; the logits' own dtype."""
    prefix = list(range(1, _PROBE_PREFIX + 1))
    fulls = []
    for n in _PROBE_SUFFIXES:
        cache = make_prompt_cache(model)
        model(mx.array([prefix + list(range(20, 20 + n))]), cache=cache)
        mx.eval([c.state for c in cache])
        fulls.append(cache)
    kv = [i for i, kind in enumerate(kinds) if kind == "kv"]
    group = SharedPrefix(
        ("probe",),
        _PROBE_PREFIX,
        [fulls[0][i].keys[..., :_PROBE_PREFIX, :] for i in kv],
        [fulls[0][i].values[..., :_PROBE_PREFIX, :] for i in kv],
    )
    kv_index = {layer: k for k, layer in enumerate(kv)}
    rows = [
        [SharedRowCache.of(c[i], group, kv_index[i], _PROBE_PREFIX) if i in kv_index else c[i] for i in range(len(c))]
        for c in fulls
    ]
    plain_rows = [[_copy(layer) for layer in c] for c in fulls]
    plain = [type(plain_rows[0][i]).merge([r[i] for r in plain_rows]) for i in range(len(kinds))]
    shared = [type(rows[0][i]).merge([r[i] for r in rows]) for i in range(len(kinds))]
    step = mx.array([[7], [9]])
    plain_logits = model(step, cache=plain)[:, -1]
    shared_logits = model(step, cache=shared)[:, -1]
    mx.eval(plain_logits, shared_logits)
    calls = sum(layer.cascade_calls for layer in shared if isinstance(layer, CascadeBatchKVCache))
    return plain_logits.astype(mx.float32), shared_logits.astype(mx.float32), calls, plain_logits.dtype


def _copy(layer: Any) -> Any:
    """The same layer cache again (merging twice must not share state between the two batches)."""
    return copy.deepcopy(layer)
