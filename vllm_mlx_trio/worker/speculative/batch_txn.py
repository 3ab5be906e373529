"""The cache transaction of a batched verify forward: each row keeps its own number of the inputs written.

Attention layers (``BatchKVCache``) roll back per row by trimming and shifting (worker/speculative/ragged.py).
Linear-attention layers (mlx-lm's ``ArraysCache``: GatedDeltaNet's conv and recurrent states, in Qwen3.5 /
Qwen3-Next) fold every input into one state per row; as in the one-row transaction (worker/speculative/cache_txn.py)
their states are snapshotted before the verify and each such layer's mixer input is recorded, and when some row
kept fewer inputs than were written the states are restored and the mixers replay the recorded inputs. The replay is
ragged through mlx-lm's own right-padding support: with the cache's ``lengths`` set to each row's kept count, the
mixer masks every later position out of the recurrent update and takes the conv state at each row's own end, in one
call for the whole batch. By causality the replayed inputs are those a forward of just the kept tokens produces.

:func:`batch_rollback_problem` checks at load, on the model itself, that rows rolled back to different lengths then
continue exactly as rows that never saw the rejected inputs. MLX thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, make_prompt_cache

from .cache_txn import ROLLBACK_TOLERANCE, _install_taps, remove_taps
from .ragged import keep_rows

#: The per-layer cache types a batched rollback covers (one-row form; batched they are BatchKVCache / ArraysCache).
ROLLBACK_TYPES = (KVCache, ArraysCache)


class BatchTransaction:
    """Opened on a batched cache just before a verify forward writing ``written`` inputs per row."""

    def __init__(self, model: Any, cache: Sequence[Any], written: int):
        self._cache = list(cache)
        self._written = written
        self._saved = {
            index: (list(layer.cache), layer.left_padding, layer.lengths)
            for index, layer in enumerate(self._cache)
            if isinstance(layer, ArraysCache)
        }
        self._taps = _install_taps(model, self._cache) if self._saved else {}

    def keep(self, keep: Sequence[int]) -> None:
        """Leave row ``i`` holding what it held before plus the first ``keep[i]`` inputs."""
        recorded, self._taps = remove_taps(self._taps), {}
        keep_rows([layer for layer in self._cache if isinstance(layer, BatchKVCache)], self._written, keep)
        if not self._saved or all(n == self._written for n in keep):
            return
        missing = sorted(set(self._saved) - set(recorded))
        if missing:
            raise RuntimeError(f"no recorded mixer input for the linear-attention layers {missing}")
        longest = max(keep)
        for index, (arrays, left_padding, lengths) in self._saved.items():
            layer = self._cache[index]
            # an array of its own per layer: the mixer's ``advance`` subtracts from ``lengths`` in place
            layer.cache, layer.left_padding, layer.lengths = list(arrays), left_padding, mx.array(list(keep))
            mixer, (x, mask) = recorded[index]
            replay_mask = layer.make_mask(longest)
            if mask is not None:
                replay_mask = replay_mask & mask[..., :longest]
            mixer(x[:, :longest], replay_mask, layer)
            layer.lengths = lengths
            layer.left_padding = None if left_padding is None else left_padding - mx.array(list(keep))


def open_batch_transaction(model: Any, cache: Sequence[Any], written: int) -> BatchTransaction:
    return BatchTransaction(model, cache, written)


def batch_rollback_problem(model: Any) -> str | None:
    """Why rows of a batched verify of this model cannot each keep their own count, or None if they can: two rows
    verify three inputs, keep two and one, and their next logits must match plain forwards of the kept tokens."""
    if not all(isinstance(layer, ROLLBACK_TYPES) for layer in make_prompt_cache(model)):
        names = sorted({type(layer).__name__ for layer in make_prompt_cache(model)})
        return f"its cache ({', '.join(names)}) has layers a per-row rollback does not cover"
    rows, verified, kept = ([0, 1], [0]), ([2, 3, 9], [4, 9, 9]), (2, 1)
    expected = []
    for prefix, inputs, n in zip(rows, verified, kept, strict=True):
        cache = make_prompt_cache(model)
        expected.append(model(mx.array([[*prefix, *inputs[:n], 5]]), cache=cache)[:, -1])
    try:
        caches = []
        for prefix in rows:
            cache = make_prompt_cache(model)
            model(mx.array([prefix]), cache=cache)
            caches.append(cache)
        batch = [type(caches[0][i]).merge([c[i] for c in caches]) for i in range(len(caches[0]))]
        transaction = open_batch_transaction(model, batch, 3)
        model(mx.array(list(verified)), cache=batch)
        transaction.keep(list(kept))
        got = model(mx.array([[5], [5]]), cache=batch)[:, -1]
        mx.eval(got, expected)
    except Exception as exc:  # boundary: whatever the model's cache types raise
        return f"rows of its cache cannot be rolled back one by one: {type(exc).__name__}: {exc}"
    for row, want in enumerate(expected):
        scale = mx.abs(want).max().item() or 1.0
        if mx.abs(got[row : row + 1].astype(mx.float32) - want.astype(mx.float32)).max().item() > (
            ROLLBACK_TOLERANCE * scale
        ):
            return "rolling rows of its cache back one by one does not restore them"
    return None
