"""The KV the running batch holds when rows share a cached prefix once (``cache.share_prefix_in_batch``).

The batched runner keeps one prefix for the batch (worker/cascade/): the cached full blocks of the first running
row whose hit reached ``min_tokens``, which later rows share as far as their hits go along it. Without sharing the
batch's KV is a rectangle, rows x longest row; with it, the prefix once plus rows x longest *suffix* (each row past
the tokens it shares). This counter mirrors that on the scheduler's side, by tokens: each running row's shared
tokens, set when it starts (from its hit and the group's first row's prompt), and an estimate for a waiting one
(what it has in common with the group's prompt, within what the group's rows already share: their blocks are
leased, so its lookup will hit them).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import attrs


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have in common."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        mid = (low + high) // 2
        if a[:mid] == b[:mid]:
            low = mid
        else:
            high = mid
    return low


@attrs.define
class SharedPrefixCount:
    """Each running row's shared tokens, by request id, and the group's first row (its prompt)."""

    block_size: int
    min_tokens: int
    _shared: dict[Hashable, int] = attrs.field(factory=dict)
    _anchor: tuple[Hashable, tuple[int, ...]] | None = None

    def start(self, request_id: Hashable, token_ids: Sequence[int], num_cached_tokens: int) -> None:
        """A row starts with a hit of ``num_cached_tokens``: the tokens it shares with the batch's group."""
        hit = num_cached_tokens // self.block_size * self.block_size
        if self._anchor is None:
            shared = hit if hit >= self.min_tokens else 0
            if shared:
                self._anchor = (request_id, tuple(token_ids))
        else:
            shared = self._within_group(token_ids, hit)
        self._shared[request_id] = shared

    def estimate(self, token_ids: Sequence[int]) -> int:
        """The tokens a waiting row would share: along the group's prompt, as far as the group's rows share."""
        if self._anchor is None:
            return 0
        return self._within_group(token_ids, max(self._shared.values(), default=0))

    def _within_group(self, token_ids: Sequence[int], limit: int) -> int:
        assert self._anchor is not None
        common = common_prefix(self._anchor[1], token_ids[: len(token_ids) - 1])
        shared = min(limit, common // self.block_size * self.block_size)
        return shared if shared >= self.min_tokens else 0

    def leave(self, request_id: Hashable, running: Sequence[Hashable], tokens_of: Callable[[Hashable], Sequence[int]]):
        """A row left; ``running``: the rows still running, oldest first (a new group's first row is the oldest
        that shares), ``tokens_of`` their tokens."""
        self._shared.pop(request_id, None)
        if self._anchor is None or self._anchor[0] != request_id:
            return
        sharing = [rid for rid in running if self._shared.get(rid, 0) > 0]
        self._anchor = (sharing[0], tuple(tokens_of(sharing[0]))) if sharing else None

    def shared(self, request_id: Hashable) -> int:
        return self._shared.get(request_id, 0)


def kv_tokens(lengths: Sequence[int], shared: Sequence[int], headroom: int) -> int:
    """KV token slots of rows this long, each sharing ``shared`` tokens of one prefix held once, once each has
    grown by ``headroom``: the prefix, plus rows x longest suffix."""
    if not lengths:
        return 0
    prefix = max(shared)
    return prefix + len(lengths) * (max(n - s for n, s in zip(lengths, shared, strict=True)) + headroom)
