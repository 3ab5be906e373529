"""Batched speculation: draft and verify for several rows in one target forward, each row accepting its own count.

A :class:`SpecBatch` holds the rows on the speculative path together: the target's batched KV cache (one
``BatchKVCache`` a layer, rows left-padded) and the draft model's (worker/speculative/draft_batch.py), in the same
row order. Each row's cache holds its prompt and every token it emitted; its *pending* token (the target's next
token, computed but not yet emitted or cached) is its own, as on the one-row path (worker/speculative/moves.py).

A round with ``k`` drafts (the per-step rule, core/spec_rule.py, picks ``k``; 0 is a plain decode step):

1. the draft model drafts ``k`` tokens for every row at once (``(B, k)``, lazy);
2. one target forward of ``(B, k + 1)``: each row's ``[pending, d1..dk]``;
3. the verdict, per row, on the device: greedy rows together (the longest prefix agreeing with the target's argmax
   of the log-softmax, as the batch's greedy sampler picks), sampled rows by speculative rejection sampling with their
   own sampler; a row with fewer tokens left than ``k + 1`` accepts at most what it may emit;
4. one read of drafts and verdicts (the round's only host-device wait);
5. every row's caches keep exactly their accepted tokens (worker/speculative/ragged.py: rows that accepted less are
   shifted so no rejected key stays visible), and each row emits ``pending, d1..da`` and takes the verdict's next
   token as its new pending token.

MLX thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache

from ...core.speculative import SpecDecodeCounts
from ...messages import RequestId
from .batch_txn import open_batch_transaction
from .draft_batch import DraftBatch
from .sampling import SpecSampler

#: The verify forward ``(inputs (B, L), cache) -> (logits (B, L, vocab), hidden (B, L, H) or None)``.
Forward = Callable[[mx.array, list[Any]], tuple[mx.array, Any]]


@attrs.define(slots=True, eq=False)
class SpecRow:
    """One row of a speculative batch: what its target cache holds, and its pending token."""

    request_id: RequestId
    tokens: list[int]
    pending: int
    #: A sampled request's drafting and verdict; None: greedy.
    sampler: SpecSampler | None = None


@attrs.frozen(slots=True)
class RowResult:
    """What a round gave one row: the tokens to emit, and the drafts it proposed and accepted."""

    row: SpecRow
    tokens: tuple[int, ...]
    num_proposed: int
    num_accepted: int


class SpecBatch:
    """The rows on the speculative path, their target and draft caches, and the round."""

    def __init__(self, target: Any, draft: DraftBatch | Any, forward: Forward | None = None):
        self._target = target
        self._draft = draft
        #: The verify forward: (logits, the target's hidden states or None); the plain forward by default.
        self._forward = forward or (lambda inputs, cache: (target(inputs, cache=cache), None))
        self.rows: list[SpecRow] = []
        self._cache: list[BatchKVCache] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, rows: Sequence[SpecRow], caches: Sequence[list[Any]], hiddens: Sequence[Any] = ()) -> None:
        """Append rows with their target caches (one ``KVCache`` a layer, holding ``row.tokens``) and, for a drafter
        that reads them, the target's hidden states ending at each row's last cached position (None: none kept)."""
        self._draft.add([row.tokens for row in rows], self._tails(self._draft.lag), hiddens)
        merged = [type(caches[0][i]).merge([cache[i] for cache in caches]) for i in range(len(caches[0]))]
        if self._cache is None or not self.rows:
            self._cache = merged
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
        self.rows.extend(rows)

    def remove(self, rows: Sequence[SpecRow]) -> None:
        gone = {id(row) for row in rows}
        keep = [i for i, row in enumerate(self.rows) if id(row) not in gone]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        self._draft.filter(keep)
        if not keep:
            self._cache = None
            return
        assert self._cache is not None
        for layer in self._cache:
            layer.filter(keep)

    def extract(self, row: SpecRow) -> list[Any]:
        """A copy of one row's target cache (one ``KVCache`` or ``ArraysCache`` a layer)."""
        assert self._cache is not None
        index = self.rows.index(row)
        return [layer.extract(index) for layer in self._cache]

    def round(self, num_drafts: int, tokens_left: Sequence[int]) -> list[RowResult]:
        """One draft -> verify -> accept round of every row with ``num_drafts`` drafts; ``tokens_left[i]``: the
        tokens row ``i`` may still emit (it accepts at most ``tokens_left[i] - 1`` drafts)."""
        assert self._cache is not None
        budgets = [max(0, min(num_drafts, left - 1)) for left in tokens_left]
        pending = mx.array([row.pending for row in self.rows], dtype=mx.uint32)
        if num_drafts:
            picks = [None if row.sampler is None else row.sampler.pick for row in self.rows]
            drafts = self._draft.propose(self._tails(self._draft.lag), pending, num_drafts, picks)
            inputs = mx.concatenate([pending[:, None], drafts], axis=1)
        else:
            drafts, inputs = mx.zeros((len(self.rows), 0), dtype=mx.uint32), pending[:, None]
        transaction = open_batch_transaction(self._target, self._cache, num_drafts + 1)
        logits, hidden = self._forward(inputs, self._cache)
        accepted, next_tokens = self._verdict(drafts, logits, budgets)
        mx.eval(accepted, next_tokens, drafts)  # the round's one wait
        num_accepted, nexts, draft_ids = accepted.tolist(), next_tokens.tolist(), drafts.tolist()
        transaction.keep([1 + a for a in num_accepted])
        self._draft.settle(num_accepted, num_drafts, inputs, hidden)
        results = []
        for row, a, nxt, ids, budget in zip(self.rows, num_accepted, nexts, draft_ids, budgets, strict=True):
            emitted = (row.pending, *ids[:a])
            row.tokens.extend(emitted)
            row.pending = nxt
            results.append(RowResult(row, emitted, budget, a))
        return results

    def _verdict(self, drafts: mx.array, logits: mx.array, budgets: Sequence[int]) -> tuple[mx.array, mx.array]:
        """(drafts accepted ``(B,)``, each row's next token ``(B,)``), lazy."""
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        target = mx.argmax(logprobs, axis=-1).astype(mx.uint32)  # (B, k + 1)
        if drafts.shape[1]:
            agree = (drafts == target[:, :-1]).astype(mx.int32)
            accepted = mx.minimum(mx.cumprod(agree, axis=1).sum(axis=1), mx.array(budgets, dtype=mx.int32))
        else:
            accepted = mx.zeros((len(self.rows),), dtype=mx.int32)
        next_tokens = mx.take_along_axis(target, accepted[:, None], axis=1)[:, 0]
        sampled = [i for i, row in enumerate(self.rows) if row.sampler is not None]
        if not sampled:
            return accepted, next_tokens
        counts = [accepted[i : i + 1] for i in range(len(self.rows))]
        tokens = [next_tokens[i : i + 1] for i in range(len(self.rows))]
        for i in sampled:
            sampler = self.rows[i].sampler
            assert sampler is not None
            n = budgets[i]
            q = sampler.take_draft_probs(drafts.shape[1])[:n] if drafts.shape[1] else mx.zeros((0, 1))
            count, token = sampler.verdict(drafts[i, :n], q, logits[i : i + 1, : n + 1])
            counts[i], tokens[i] = count.reshape(1).astype(mx.int32), token.reshape(1)
        return mx.concatenate(counts), mx.concatenate(tokens)

    def _tails(self, lag: int) -> list[list[int]]:
        """Each row's last ``1 + lag`` target tokens."""
        return [row.tokens[len(row.tokens) - 1 - lag :] for row in self.rows]


def round_counts(results: Sequence[RowResult]) -> SpecDecodeCounts:
    """The spec-decode counts of one round: one draft per row that proposed any."""
    counts = SpecDecodeCounts()
    for result in results:
        if result.num_proposed:
            counts += SpecDecodeCounts.of_round(result.num_proposed, result.num_accepted)
    return counts
