"""The MTP head's side of a speculative batch (worker/speculative/spec_batch.py): drafts for every row at once.

The same pairs as the one-row drafter (worker/speculative/mtp/drafter.py), batched: the head's attention cache (one
``BatchKVCache`` a layer) holds, per row, the pairs (target hidden at ``i``, token at ``i + 1``) up to the row's last
cached position, and :attr:`MTPBatch._pending` ``(B, 1, H)`` is each row's target hidden state at that position (the
one whose logits gave its pending token).

* :meth:`MTPBatch.propose` runs the head ``k`` times from the pending hidden states and the pending tokens (every
  row writes ``k`` entries);
* :meth:`MTPBatch.settle` drops those entries, forwards the ``k + 1`` pairs the verify confirmed or refuted for every
  row, (pending hidden, pending token) and (verify hidden of position ``j``, draft ``j + 1``), and keeps each row's
  first ``1 + a`` of them (worker/speculative/ragged.py); the verify hidden at position ``a`` becomes the row's
  pending hidden. A round without drafts forwards the one pair (pending hidden, pending token).

A row that enters without hidden states (none were kept) drafts from zeros until its first round settles: its drafts
are refused, never wrong output. MLX thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from ..draft_batch import Pick, _choose
from ..ragged import keep_rows


class MTPBatch:
    """The MTP head's batched cache and pending hidden states for the rows of a speculative batch."""

    needs_target_hidden = True
    #: The head needs no lagging token tails (its pairs settle every round).
    lag = 0

    def __init__(self, head: Any, embed: Any, lm_head: Any, *, hidden_state_mode: str):
        self._head, self._embed, self._lm_head = head, embed, lm_head
        self.hidden_state_mode = hidden_state_mode
        self._hidden_size = int(embed(mx.array([[0]])).shape[-1])
        self._cache: list[BatchKVCache] | None = None
        self._pending: mx.array | None = None  # (B, 1, H)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, rows_tokens: Sequence[Sequence[int]], tails: Sequence[Sequence[int]], hiddens: Sequence[Any]) -> None:
        """Append rows whose target caches hold ``rows_tokens``, with the target's hidden states ending at each
        row's last cached position (None: none kept)."""
        caches, pending = [], []
        for tokens, hidden in zip(rows_tokens, list(hiddens) or [None] * len(rows_tokens), strict=True):
            cache = self._head.make_cache()
            if hidden is None or not tokens:
                pending.append(mx.zeros((1, 1, self._hidden_size)))
            else:
                rows = min(int(hidden.shape[1]), len(tokens))
                if rows > 1:  # hidden at tokens[-rows + i] pairs with the token after it
                    context = mx.array([list(tokens[len(tokens) - rows + 1 :])], dtype=mx.int32)
                    self._head(self._embed(context), hidden[:, -rows:-1], cache)
                    mx.eval([c.state for c in cache])
                pending.append(hidden[:, -1:])
            caches.append(cache)
        merged = [BatchKVCache.merge([cache[layer] for cache in caches]) for layer in range(len(caches[0]))]
        if self._cache is None or self._size == 0:
            self._cache, self._pending = merged, mx.concatenate(pending)
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
            self._pending = mx.concatenate([self._pending, *pending])
        self._size += len(rows_tokens)

    def filter(self, keep: Sequence[int]) -> None:
        assert self._cache is not None and self._pending is not None
        self._size = len(keep)
        if not keep:
            self._cache, self._pending = None, None
            return
        for layer in self._cache:
            layer.filter(list(keep))
        self._pending = self._pending[mx.array(list(keep))]

    def propose(self, tails: Any, pending: mx.array, num_tokens: int, picks: Sequence[Pick | None]) -> mx.array:
        """``num_tokens`` drafts per row after its ``pending`` token (``(B,)``): lazy ``uint32 (B, num_tokens)``."""
        assert self._cache is not None and num_tokens > 0
        hidden, token = self._pending, pending.astype(mx.int32)[:, None]
        drafts = []
        for _ in range(num_tokens):
            hidden = self._head(self._embed(token), hidden, self._cache)
            chosen = _choose(self._lm_head(hidden)[:, -1, :], picks)
            drafts.append(chosen)
            token = chosen.astype(mx.int32)[:, None]
        return mx.stack(drafts, axis=1)

    def settle(self, num_accepted: Sequence[int], num_drafts: int, inputs: mx.array, hidden: mx.array) -> None:
        """After the verify of ``inputs`` ``(B, num_drafts + 1)`` with the target's ``hidden`` states."""
        assert self._cache is not None and self._pending is not None
        for layer in self._cache:
            layer.trim(num_drafts)
        pairs = mx.concatenate([self._pending, hidden[:, :num_drafts]], axis=1)
        self._head(self._embed(inputs.astype(mx.int32)), pairs, self._cache)
        keep_rows(self._cache, num_drafts + 1, [1 + a for a in num_accepted])
        index = mx.array(list(num_accepted), dtype=mx.int32)[:, None, None]
        self._pending = mx.take_along_axis(hidden, index, axis=1)
