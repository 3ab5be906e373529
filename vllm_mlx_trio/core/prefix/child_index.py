"""The prefix cache's entries by parent, for the lookup's token-granular end. Pure.

Every entry hangs under its *parent key*: the chained hash of the full block before it, or,
at depth 0, :func:`root_key` of the request's extra keys. A full block hangs there with its
``block_size`` tokens, a tail with its own (fewer) tokens, so the lookup finds, after the last
matching full block, the entry sharing the most tokens with the rest of the prompt.

A tail is a checkpoint at a position that full blocks alone cannot give: the KV of the
tokens after the last full block (0 to ``block_size - 1`` of them) and, for models with
sliding-window or recurrent layers, those layers' state at exactly that position. It hangs
under its *parent key*: the chained hash of the last full block before it, or, at depth 0,
:func:`root_key` of the request's extra keys. The pool leases a tail together with the
blocks of its chain, so a tail is never leased while its parent block is free.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterator

from ..plan import BlockId
from .block_hash import block_hash

Tokens = tuple[int, ...]


def root_key(extra_keys: tuple[Hashable, ...]) -> bytes:
    """The parent key of depth-0 tails: no real block hashes an empty token run."""
    return block_hash(None, (), extra_keys)


Media = tuple[tuple[int, Hashable], ...]
"""The media keys starting inside an entry (``core/prefix/media_keys.py``): two entries with equal
tokens under one parent differ when the images they show do."""


class ChildIndex:
    """Entries by (parent key, tokens, media); under each parent their distinct token runs are
    also kept sorted, so the lookup finds the runs sharing the most tokens with a prompt's next
    block next to where that block would sort, without reading every child (a parent such as
    a shared system prompt's last block can have a child for every conversation)."""

    def __init__(self) -> None:
        # parent key -> tokens -> media -> id
        self._by_parent: dict[bytes, dict[Tokens, dict[Media, BlockId]]] = {}
        # parent key -> the keys of its _by_parent entry, sorted
        self._sorted: dict[bytes, list[Tokens]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, parent: bytes, tokens: Tokens, media: Media = ()) -> BlockId | None:
        return self._by_parent.get(parent, {}).get(tokens, {}).get(media)

    def add(self, parent: bytes, tokens: Tokens, tail_id: BlockId, media: Media = ()) -> None:
        by_tokens = self._by_parent.setdefault(parent, {})
        variants = by_tokens.get(tokens)
        if variants is None:
            variants = by_tokens[tokens] = {}
            bisect.insort(self._sorted.setdefault(parent, []), tokens)
        assert media not in variants, "one entry per (parent, tokens, media)"
        variants[media] = tail_id
        self._count += 1

    def remove(self, parent: bytes, tokens: Tokens, media: Media = ()) -> None:
        by_tokens = self._by_parent[parent]
        variants = by_tokens[tokens]
        del variants[media]
        self._count -= 1
        if variants:
            return
        del by_tokens[tokens]
        keys = self._sorted[parent]
        del keys[bisect.bisect_left(keys, tokens)]
        if not by_tokens:
            del self._by_parent[parent]
            del self._sorted[parent]

    def under(self, parent: bytes) -> Iterator[BlockId]:
        """Every entry hanging under ``parent``."""
        for variants in self._by_parent.get(parent, {}).values():
            yield from variants.values()

    def closest(self, parent: bytes, rest: Tokens) -> Iterator[tuple[int, Tokens, BlockId]]:
        """The children of ``parent`` that share at least a token with ``rest``, then the empty
        ones: ``(tokens shared with rest, the child's tokens, its id)``, most shared first, so
        a caller may stop at the first that cannot beat what it has. Sorted runs share the
        most with ``rest`` next to where it would sort, less the farther from there."""
        keys = self._sorted.get(parent)
        if not keys:
            return
        variants = self._by_parent[parent]
        for shared, tokens in _outward(keys, rest):
            if shared == 0:
                break
            for block_id in variants[tokens].values():
                yield shared, tokens, block_id
        if keys[0] == ():
            for block_id in variants[()].values():
                yield 0, (), block_id


def _outward(keys: list[Tokens], rest: Tokens) -> Iterator[tuple[int, Tokens]]:
    """``keys`` (sorted) with the tokens each shares with ``rest``, most first: from where
    ``rest`` would sort, outwards, the larger share of the two sides each time."""
    right = bisect.bisect_left(keys, rest)
    left = right - 1
    left_shared = common_length(keys[left], rest) if left >= 0 else -1
    right_shared = common_length(keys[right], rest) if right < len(keys) else -1
    while left_shared >= 0 or right_shared >= 0:
        if left_shared >= right_shared:
            yield left_shared, keys[left]
            left -= 1
            left_shared = common_length(keys[left], rest) if left >= 0 else -1
        else:
            yield right_shared, keys[right]
            right += 1
            right_shared = common_length(keys[right], rest) if right < len(keys) else -1


def common_length(a: Tokens, b: Tokens) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
