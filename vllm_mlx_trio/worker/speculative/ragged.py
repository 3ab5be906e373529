"""Ragged rollback of a batched KV cache: after one forward wrote the same number of inputs for every row, each row
keeps its own number of them.

mlx-lm's ``BatchKVCache`` keeps every row's keys left-padded and right-aligned at one shared write index (``_idx``):
row ``i`` holds ``_idx - left_padding[i]`` tokens, its RoPE offset is ``offset[i]``, and the attention mask hides the
padding. A verify forward writes ``written`` inputs for every row; row ``i`` keeps ``keep[i]`` of them. Trimming the
whole batch by ``written - max(keep)`` leaves the longest keepers exact, but a row that kept fewer would still see the
keys of its rejected drafts ("phantom keys") at the end of its row, between its real keys and the next write. So each
such row is rewritten: shifted right by ``max(keep) - keep[i]`` (its rejected keys wrap round into the padding at the
front), its left padding grows and its offset shrinks by the same amount. The mask then hides exactly what the row
did not keep, and the next write lands right after the row's last kept key.

The shift copies the rows' keys and values once (one gather per layer); when every row kept the same number nothing is
copied. After a shift, padding every row shares is cut from the front (as ``BatchKVCache.filter`` does when rows
leave), so the batch is never longer than its longest row: a row that kept less than another this round but is
longer overall would otherwise leave the whole batch padded. MLX thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache, dynamic_roll, make_prompt_cache


def plain_attention(model: Any) -> bool:
    """Whether every layer of ``model``'s cache is a plain ``KVCache`` (batched: a ``BatchKVCache``, which
    :func:`keep_rows` rolls back per row)."""
    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


def keep_rows(cache: Sequence[BatchKVCache], written: int, keep: Sequence[int]) -> None:
    """Leave row ``i`` of every layer holding what it held before the last ``written`` inputs plus the first
    ``keep[i]`` of them (``0 <= keep[i] <= written``)."""
    if not keep:
        return
    if min(keep) < 0 or max(keep) > written:
        raise ValueError(f"keep {list(keep)} of {written} written inputs")
    longest = max(keep)
    shifts = [longest - n for n in keep]
    shift = mx.array(shifts, dtype=mx.int32) if any(shifts) else None
    for layer in cache:
        layer.trim(written - longest)
        if shift is None or layer.keys is None:
            continue
        end = layer._idx  # the write index has no public reader: mlx-lm 0.32.2's BatchKVCache
        layer.keys[..., :end, :] = dynamic_roll(layer.keys[..., :end, :], shift[:, None], axis=2)
        layer.values[..., :end, :] = dynamic_roll(layer.values[..., :end, :], shift[:, None], axis=2)
        layer.left_padding = layer.left_padding + shift
        layer.offset = layer.offset - shift
    if shift is not None:
        _trim_shared_padding(cache)


def _trim_shared_padding(cache: Sequence[BatchKVCache]) -> None:
    """Cut the padding every row has from the front of every layer (one host read of the first layer's)."""
    shared = int(cache[0].left_padding.min().item())
    if shared <= 0:
        return
    for layer in cache:
        if layer.keys is not None:
            layer.keys = layer.keys[..., shared:, :]
            layer.values = layer.values[..., shared:, :]
        layer._idx -= shared
        layer.left_padding = layer.left_padding - shared


def row_lengths(cache: Sequence[BatchKVCache]) -> list[int]:
    """Tokens each row of the first layer holds (for tests and checks)."""
    layer = cache[0]
    return (layer._idx - layer.left_padding).tolist()
