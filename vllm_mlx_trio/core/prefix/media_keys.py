"""Media-position keys of the prefix cache: which image or video a block's KV depends on. Pure.

A multimodal prompt's request carries ``media_keys``: ((token position where a media item's
tokens start, its content key), ...) in prompt order. The KV of the tokens before a media
item's start does not depend on it, so text before the first image is shared between
requests showing different images; from that image's block on it is not.

Block ``i`` (tokens ``[i*size, (i+1)*size)``) folds the keys whose start lies inside it, each
key in the first block it reaches; the hash chain carries it on to every later block. A tail
(a checkpoint at position ``t``, after ``d`` full blocks) folds the keys starting in
``[d*size, t)``. A key never folds into an entry that ends at or before its position.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Sequence

from .block_hash import block_hash

MediaKeys = tuple[tuple[int, Hashable], ...]
"""((start position, content key), ...), sorted by position."""


def normalize_media_keys(media_keys: Iterable[tuple[int, Hashable]]) -> MediaKeys:
    """The keys as a tuple sorted by start position (stable: prompt order among equal starts)."""
    keys = tuple((int(position), key) for position, key in media_keys)
    if any(position < 0 for position, _ in keys):
        raise ValueError(f"media positions must be >= 0, got {keys}")
    return tuple(sorted(keys, key=lambda item: item[0]))


def media_between(media: MediaKeys, start: int, end: int) -> MediaKeys:
    """The keys whose start position lies in ``[start, end)``."""
    return tuple(item for item in media if start <= item[0] < end)


def first_difference(a: MediaKeys, b: MediaKeys) -> int | None:
    """The first position at which two key lists disagree (None: they are equal). The KV of
    every token before that position is the same under both."""
    for item_a, item_b in zip(a, b, strict=False):
        if item_a != item_b:
            return min(item_a[0], item_b[0])
    if len(a) == len(b):
        return None
    return (a if len(a) > len(b) else b)[min(len(a), len(b))][0]


def chain_hashes(
    token_ids: Sequence[int], extra_keys: tuple[Hashable, ...], media: MediaKeys, size: int, num_blocks: int
) -> Iterator[bytes]:
    """The chained hashes of the first ``num_blocks`` blocks of ``size`` tokens, lazily.

    The first block folds ``extra_keys``; every block folds the media keys starting inside it.
    """
    parent: bytes | None = None
    for index in range(num_blocks):
        start = index * size
        chunk = tuple(token_ids[start : start + size])
        parent = block_hash(parent, chunk, extra_keys if index == 0 else (), media_between(media, start, start + size))
        yield parent
