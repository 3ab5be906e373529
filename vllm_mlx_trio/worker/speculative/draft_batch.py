"""The draft model's side of a speculative batch: one batched KV cache for every row, drafts for all rows at once.

Invariant between rounds: row ``i`` of the draft cache holds its target cache's tokens but the last ``1 + lag``
(``lag`` is the same for every row: a round with no drafts advances every row by exactly one token, and only then
does the lag grow). A round with ``k`` drafts feeds each row's last ``1 + lag`` target tokens and its pending token
in one forward (``(B, lag + 2)``), then ``k - 1`` one-token forwards; the cache has then written ``lag + k + 1``
inputs per row. After the verify, row ``i`` accepted ``a[i]`` drafts: its target cache grew by ``1 + a[i]``, so its
draft cache keeps ``lag + 1 + a[i]`` of the written inputs (worker/speculative/ragged.py) and the lag is 0 again.

Rows are added at the end (their own prefill, merged into the batch) and filtered out like the target's rows.
MLX thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from .draft_model import DRAFT_PREFILL_STEP
from .ragged import keep_rows

#: Chooses a draft from the draft model's logits ``(1, vocab)``: ``uint32`` of shape ``(1,)`` (a sampled request).
Pick = Callable[[mx.array], mx.array]


class DraftBatch:
    """The draft model's batched cache for the rows of a speculative batch, in the batch's row order."""

    def __init__(self, model: Any, *, prefill_step: int = DRAFT_PREFILL_STEP):
        self._model = model
        self._prefill_step = prefill_step
        self._cache: list[BatchKVCache] | None = None
        self._size = 0
        #: Every row's draft cache ends this many tokens before its target cache's last token.
        self.lag = 0
        self._written = 0  # inputs per row the last propose wrote

    def __len__(self) -> int:
        return self._size

    #: Tokens are all it needs (no target hidden states).
    needs_target_hidden = False

    def add(
        self, rows_tokens: Sequence[Sequence[int]], tails: Sequence[Sequence[int]], hiddens: Sequence[Any] = ()
    ) -> None:
        """Append rows whose target caches hold ``rows_tokens``; ``tails`` are the existing rows' last ``1 + lag``
        target tokens (fed first, so the batch joins at lag 0); ``hiddens`` are not needed."""
        self.catch_up(tails)
        caches = []
        for tokens in rows_tokens:
            cache = make_prompt_cache(self._model)
            context = list(tokens[:-1])
            for start in range(0, len(context), self._prefill_step):
                self._model(mx.array([context[start : start + self._prefill_step]]), cache=cache)
                mx.eval([c.state for c in cache])
            caches.append(cache)
        merged = [BatchKVCache.merge([cache[layer] for cache in caches]) for layer in range(len(caches[0]))]
        if self._cache is None or self._size == 0:
            self._cache = merged
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
        self._size += len(rows_tokens)

    def filter(self, keep: Sequence[int]) -> None:
        """Keep only the rows at these indices (in this order)."""
        assert self._cache is not None
        self._size = len(keep)
        if not keep:
            self._cache, self.lag = None, 0
            return
        for layer in self._cache:
            layer.filter(list(keep))

    def catch_up(self, tails: Sequence[Sequence[int]]) -> None:
        """Feed every row's last ``lag`` target tokens but one (``tails``: the last ``1 + lag``): the lag is 0."""
        if self.lag and self._size:
            self._model(mx.array([list(t[:-1]) for t in tails], dtype=mx.uint32), cache=self._cache)
        self.lag = 0

    def propose(self, tails: Sequence[Sequence[int]], pending: mx.array, num_tokens: int, picks: Sequence[Pick | None]):
        """``num_tokens`` drafts per row after its ``pending`` token (``(B,)``), lazy ``uint32 (B, num_tokens)``;
        ``tails``: each row's last ``1 + lag`` target tokens; ``picks``: each row's chooser (None: the argmax)."""
        assert self._cache is not None and num_tokens > 0
        inputs = mx.concatenate([mx.array([list(t) for t in tails], dtype=mx.uint32), pending[:, None]], axis=1)
        self._written = inputs.shape[1] + num_tokens - 1
        drafts = []
        for _ in range(num_tokens):
            logits = self._model(inputs, cache=self._cache)[:, -1, :]
            token = _choose(logits, picks)
            drafts.append(token)
            inputs = token[:, None]
        return mx.stack(drafts, axis=1)

    def settle(self, num_accepted: Sequence[int], num_drafts: int, inputs: mx.array, hidden: Any = None) -> None:
        """After the verify of ``inputs`` (``(B, num_drafts + 1)``): row ``i`` accepted ``num_accepted[i]`` drafts. A
        round without drafts grew every target cache by one token and no draft cache: the lag grows."""
        if not num_drafts:
            self.lag += 1
            return
        assert self._cache is not None
        keep_rows(self._cache, self._written, [self.lag + 1 + a for a in num_accepted])
        self.lag = 0


def _choose(logits: mx.array, picks: Sequence[Pick | None]) -> mx.array:
    """Each row's draft from ``logits`` ``(B, vocab)``: the argmax, or the row's pick."""
    greedy = mx.argmax(logits, axis=-1).astype(mx.uint32)
    if not any(pick is not None for pick in picks):
        return greedy
    return mx.concatenate(
        [greedy[i : i + 1] if pick is None else pick(logits[i : i + 1]) for i, pick in enumerate(picks)]
    )
