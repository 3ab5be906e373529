"""Where a prefix-cache hit ends: after the matching full blocks, maybe inside a child. Pure."""

from __future__ import annotations

from ..plan import BlockId
from .child_index import root_key
from .media_keys import MediaKeys, first_difference, media_between
from .pool_entries import EntryTable
from .pool_types import ExtraKeys, Tokens


def best_end(
    table: EntryTable,
    block_size: int,
    prompt: tuple[Tokens, ExtraKeys, MediaKeys],
    chain: list[tuple[bytes, BlockId]],
    limit: int,
) -> tuple[int, BlockId | None, int]:
    """Where the longest hit ends: (full blocks, then the id of the entry it ends in or None,
    tokens covered).

    ``chain`` is the (hash, id) of the prompt's leading cached full blocks. After ``depth`` of
    them the hit may end in any child of the last one: inside it when its model is all plain
    KV, else only at a tail's exact end; never past ``limit`` tokens nor past a position where
    the child's media keys and the prompt's disagree.
    """
    token_ids, extra_keys, media = prompt
    best: tuple[int, BlockId | None, int] = (0, None, 0)
    for depth in range(_first_depth_that_counts(table, chain), len(chain) + 1):
        base = depth * block_size
        if depth and table[chain[depth - 1][1]].endable:
            best = (depth, None, base)
        parent = chain[depth - 1][0] if depth else root_key(extra_keys)
        rest = tuple(token_ids[base : base + block_size])
        for shared, tokens, child_id in table.children.closest(parent, rest):
            if base + shared <= best[2]:
                break  # none after it shares more
            child = table[child_id]
            differ = first_difference(child.media, media_between(media, base, base + len(tokens)))
            media_ok = len(tokens) if differ is None else differ - base
            if child.endable:
                n = min(shared, limit - base, media_ok)
            elif child.is_tail and shared == len(tokens) and media_ok == len(tokens) <= limit - base:
                n = len(tokens)
            else:
                continue
            if base + n > best[2]:
                best = (depth, child_id, base + n)
    return best


def _first_depth_that_counts(table: EntryTable, chain: list[tuple[bytes, BlockId]]) -> int:
    """The deepest depth whose chain block may end a hit: a hit ending at any shallower depth
    covers no more than that block's end, where the hit ends anyway; 0 when there is none."""
    for depth in range(len(chain), 0, -1):
        if table[chain[depth - 1][1]].endable:
            return depth
    return 0
