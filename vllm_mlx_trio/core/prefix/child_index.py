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
    """Entries by (parent key, tokens, media), and by first token for the lookup's scan."""

    def __init__(self) -> None:
        # parent key -> first tail token (None for an empty tail) -> {(tail tokens, media): id}
        self._by_parent: dict[bytes, dict[int | None, dict[tuple[Tokens, Media], BlockId]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, parent: bytes, tokens: Tokens, media: Media = ()) -> BlockId | None:
        return self._by_parent.get(parent, {}).get(_first(tokens), {}).get((tokens, media))

    def add(self, parent: bytes, tokens: Tokens, tail_id: BlockId, media: Media = ()) -> None:
        bucket = self._by_parent.setdefault(parent, {}).setdefault(_first(tokens), {})
        assert (tokens, media) not in bucket, "one entry per (parent, tokens, media)"
        bucket[tokens, media] = tail_id
        self._count += 1

    def remove(self, parent: bytes, tokens: Tokens, media: Media = ()) -> None:
        by_first = self._by_parent[parent]
        bucket = by_first[_first(tokens)]
        del bucket[tokens, media]
        self._count -= 1
        if not bucket:
            del by_first[_first(tokens)]
            if not by_first:
                del self._by_parent[parent]

    def under(self, parent: bytes) -> Iterator[BlockId]:
        """Every entry hanging under ``parent``."""
        for bucket in self._by_parent.get(parent, {}).values():
            yield from bucket.values()

    def candidates(self, parent: bytes, rest: Tokens) -> Iterator[tuple[Tokens, BlockId]]:
        """The children of ``parent`` that may start ``rest``: the empty ones, and those whose
        first token is ``rest``'s first."""
        by_first = self._by_parent.get(parent)
        if not by_first:
            return
        for key, block_id in by_first.get(None, {}).items():
            yield key[0], block_id
        if rest:
            for key, block_id in by_first.get(rest[0], {}).items():
                yield key[0], block_id


def common_length(a: Tokens, b: Tokens) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _first(tokens: Tokens) -> int | None:
    return tokens[0] if tokens else None
