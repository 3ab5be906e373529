"""The cache transaction around a verify forward, for target caches that cannot be trimmed.

A verify forward of ``[last, d1..dk]`` writes all ``k + 1`` tokens into the target's cache; only the first ``n`` stay
(``last`` and the accepted drafts). Attention caches (``KVCache``) roll back by trimming. Linear-attention and SSM
layers (mlx-lm's ``ArraysCache``: GatedDeltaNet's conv and recurrent state) fold every token into one state that
cannot be un-folded, so :class:`CacheTransaction` snapshots those states before the verify and, when some tokens
are rejected, restores every layer to the snapshot and forwards the ``n`` kept tokens again.

Exactness: after :meth:`CacheTransaction.keep` the cache is, array for array, the cache a plain forward of the kept
tokens from the snapshot produces, because that is literally what runs (the same model, the same cache, the same
tokens); when all tokens are kept nothing is redone. Cost: one extra forward of ``n`` tokens per round with a
rejection, on hybrid models only (trimmable caches never open a transaction). MLX thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, can_trim_prompt_cache


def needs_transaction(cache: Sequence[Any]) -> bool:
    """Whether rolling ``cache`` back needs a transaction (some layer cannot be trimmed)."""
    return not can_trim_prompt_cache(list(cache))


def open_transaction(model: Any, cache: Sequence[Any], inputs: Sequence[int]) -> CacheTransaction:
    """Snapshot ``cache`` before the verify forward of ``inputs`` (worker/spec_drafter.py's ``CACHE_TRANSACTION``)."""
    return CacheTransaction(model, cache, inputs)


class CacheTransaction:
    """A snapshot of a target's per-layer cache before the verify forward of ``verified``; :meth:`keep` settles it.

    ``verified`` are the tokens that forward writes (``[last, d1..dk]``); ``model`` re-forwards the kept ones.
    """

    def __init__(self, model: Any, cache: Sequence[Any], verified: Sequence[int]):
        self._model = model
        self._cache = list(cache)
        self._verified = list(verified)
        self._saved = [_snapshot(layer_cache) for layer_cache in self._cache]
        self._open = True

    def keep(self, n: int) -> None:
        """Leave the cache as if only ``verified[:n]`` had been forwarded since the snapshot (``0 <= n <= k + 1``)."""
        if not self._open:
            raise RuntimeError("the cache transaction was already settled")
        if not 0 <= n <= len(self._verified):
            raise ValueError(f"keep {n} of {len(self._verified)} verified tokens")
        self._open = False
        if n == len(self._verified):
            return  # everything stays: the cache already holds exactly these tokens
        self.rollback()
        if n:
            self._model(mx.array([self._verified[:n]], dtype=mx.int32), cache=self._cache)
            mx.eval([a for c in self._cache for a in _arrays_of(c)])

    def rollback(self) -> None:
        """Restore every layer to the snapshot (the verified tokens are all dropped)."""
        for layer_cache, saved in zip(self._cache, self._saved, strict=True):
            _restore(layer_cache, saved)
        self._open = False


def _snapshot(layer_cache: Any) -> tuple[str, Any]:
    if isinstance(layer_cache, ArraysCache):
        # MLX arrays are immutable and the layers assign new ones, so the references are the snapshot.
        return "arrays", (list(layer_cache.cache), layer_cache.left_padding, layer_cache.lengths)
    if layer_cache.is_trimmable():
        return "offset", layer_cache.offset
    return "state", (layer_cache.state, layer_cache.meta_state)


def _restore(layer_cache: Any, saved: tuple[str, Any]) -> None:
    kind, value = saved
    if kind == "arrays":
        arrays, left_padding, lengths = value
        layer_cache.cache, layer_cache.left_padding, layer_cache.lengths = list(arrays), left_padding, lengths
    elif kind == "offset":
        layer_cache.trim(layer_cache.offset - value)
    else:
        layer_cache.state, layer_cache.meta_state = value


def _arrays_of(layer_cache: Any) -> list[mx.array]:
    if isinstance(layer_cache, ArraysCache):
        return [a for a in layer_cache.cache if a is not None]
    return [a for a in layer_cache.state if isinstance(a, mx.array)]
