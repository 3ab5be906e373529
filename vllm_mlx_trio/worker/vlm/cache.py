"""KV caches that carry each row's M-RoPE position delta through mlx-lm's batching.

Qwen-VL models place an image's tokens on a 3-D (t, h, w) grid, so after a prompt with media
the next text position is not the token count but ``offset + rope_delta`` (delta <= 0 when
images compress their grid). A batch decoding image and text rows together needs the delta
*per row*; a single shared delta silently corrupts every other row (mlx-vlm issues #1095,
#1527). The delta travels with the row's cache: :class:`RopeKVCache` holds one int, and its
batch form :class:`RopeBatchKVCache` keeps a ``rope_deltas`` array aligned with the rows
through every ``merge`` / ``filter`` / ``extend`` / ``extract`` the generator does.

Both are exact subclasses of mlx-lm's ``KVCache`` / ``BatchKVCache`` (same storage), so the
prefix store cuts and rebuilds their blocks as plain KV (``worker/prefix/layers.py``).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache


class RopeKVCache(KVCache):
    """One sequence's KV, and the position delta its next tokens are placed with."""

    #: The prefix store cuts and rebuilds it as plain KV (worker/prefix/layers.py).
    prefix_layer_kind = "kv"

    def __init__(self, rope_delta: int = 0):
        super().__init__()
        self.rope_delta = rope_delta

    @classmethod
    def merge(cls, caches: list[KVCache]) -> RopeBatchKVCache:
        return RopeBatchKVCache.merge(caches)


class RopeBatchKVCache(BatchKVCache):
    """A batch of rows' KV with ``rope_deltas`` (int32, one per row) in row order."""

    def __init__(self, left_padding: list[int], rope_deltas: list[int] | None = None):
        super().__init__(left_padding)
        self.rope_deltas = mx.array(rope_deltas if rope_deltas is not None else [0] * len(left_padding), mx.int32)

    @classmethod
    def merge(cls, caches: list[KVCache]) -> RopeBatchKVCache:
        deltas = [getattr(c, "rope_delta", 0) for c in caches]
        if max(c.size() for c in caches) == 0:  # BatchKVCache.merge returns its own class here
            return cls([0] * len(caches), deltas)
        batch = super().merge(caches)  # cls(padding): a RopeBatchKVCache
        batch.rope_deltas = mx.array(deltas, mx.int32)
        return batch

    def filter(self, batch_indices) -> None:
        super().filter(batch_indices)
        self.rope_deltas = self.rope_deltas[batch_indices]

    def extend(self, other: BatchKVCache) -> None:
        deltas = getattr(other, "rope_deltas", None)
        if deltas is None:
            deltas = mx.zeros(other.offset.shape, mx.int32)
        super().extend(other)
        self.rope_deltas = mx.concatenate([self.rope_deltas, deltas])

    def extract(self, idx: int) -> RopeKVCache:
        plain = super().extract(idx)
        cache = RopeKVCache(int(self.rope_deltas[idx].item()))
        cache.keys, cache.values, cache.offset = plain.keys, plain.values, plain.offset
        return cache


def row_positions(cache: object, length: int) -> mx.array:
    """Position ids (3, B, length) for the next ``length`` tokens of every row of a batch
    cache (or of one sequence's cache): each row's own token count plus its delta."""
    offset, deltas = cache.offset, getattr(cache, "rope_deltas", None)
    if isinstance(offset, int):
        start = mx.array([offset + getattr(cache, "rope_delta", 0)])
    else:
        start = offset if deltas is None else offset + deltas
    positions = start[:, None] + mx.arange(length)[None, :]
    return mx.broadcast_to(positions[None], (3, *positions.shape))


#: mlx-vlm's recurrent-state cache classes -> their subclass marked as state arrays.
_STATE_CLASSES: dict[type, type] = {}


def state_arrays(cache: Any) -> Any:
    """``cache`` (mlx-vlm's recurrent-state cache), marked as a layer of state arrays
    (``prefix_layer_kind = "state"``) for the prefix store and the speculative cache transaction.

    The mark is on a subclass of its class, not on the instance: the generator's ``merge`` and
    ``extract`` build new caches of ``type(self)``, and those keep it."""
    cls = type(cache)
    if getattr(cls, "prefix_layer_kind", None) != "state":
        cache.__class__ = _STATE_CLASSES.setdefault(cls, type(cls.__name__, (cls,), {"prefix_layer_kind": "state"}))
    return cache
