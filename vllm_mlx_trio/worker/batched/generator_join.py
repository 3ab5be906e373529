"""Rows whose whole prompt but its last token is in their cache join mlx-lm's decode batch directly, and every
row's first token leaves in the step that computed it.

mlx-lm's ``BatchGenerator`` turns such a one-token prompt into a generation batch of its own, whose constructor runs
a forward of that token at once (and waits for it), beside the decode step of the rows already generating: two
forwards in the step that inserts it. Here the row joins the generation batch with its last prompt token as the
token to feed next, as if it had sampled it, so the next ``next()`` computes it in the same batched forward as every
other row's token. That step emits the prompt token back (the generator treats whatever it feeds as emitted), so
the runner drops that one response (:meth:`JoinedRows.take_echo`). The row's ``max_tokens`` count starts one
lower and its stop matcher skips that token, so the generator ends the row exactly where it would have.

**First token early.** A step's forward samples each row's next token, which the generator hands out one step
later, after the next forward (it only waits for a token when it feeds it back). Where that forward runs inside
``mx.async_eval`` (MLX's CPU backend), this costs a whole forward before a new row's first token. So the runner
reads a new row's first token (and its logprob row) as soon as the step that sampled it returns
(:meth:`JoinedRows.first_tokens`: a row that joined directly, or one whose prompt mlx-lm's own path ended) and
drops the generator's response for it a step later. Later tokens keep mlx-lm's pipelining.

**A first token sampled by the runner** (prefill_burst.py): a row whose cache holds its whole prompt joins
with that token as the one to feed next (:meth:`JoinedRows.join_sampled`); its response is dropped the same way.

This reaches into mlx-lm 0.32.2's ``GenerationBatch`` (its fields are not public), in this one place; the tests
compare the output with mlx-lm's own path, so a change there fails them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, StopSequences, _merge_caches
from mlx_lm.models.cache import TokenBuffer


class _SkipFirst:
    """A stop matcher that lets the echoed prompt token through without advancing on it."""

    def __init__(self, inner: StopSequences.Matcher):
        self._inner = inner
        self._skipped = False

    def advance(self, token: int) -> bool:
        if not self._skipped:
            self._skipped = True
            return False
        return self._inner.advance(token)


class JoinedRows:
    """The rows whose next response from the generator is to be dropped: a joined row's echoed prompt token, or a
    first token the runner already emitted."""

    def __init__(self) -> None:
        self._echo_pending: set[int] = set()
        self._emitted_ahead: set[int] = set()

    def join(
        self, generator: BatchGenerator, seqs: Sequence[Any], caches: Sequence[list[Any]], rows: Sequence[tuple]
    ) -> list[int]:
        """Add one row per new sequence (a ``NewSequence`` whose cache holds all its prompt but the last token;
        ``rows``: its (sampler, logits processors, stop sequences)); their uids."""
        tokens = [list(seq.prompt_token_ids[:-1]) for seq in seqs]
        with mx.stream(generator.stream):  # the merge's ops run where the generator's do
            last = mx.array([seq.prompt_token_ids[-1] for seq in seqs], dtype=mx.uint32)
            # Never read: the echoed token's response is dropped, but the step evaluates them.
            uids = self._extend(generator, seqs, caches, rows, tokens, last, [mx.zeros((1,)) for _ in seqs], echo=True)
        self._echo_pending.update(uids)
        return uids

    def join_sampled(
        self,
        generator: BatchGenerator,
        seq: Any,
        cache: list[Any],
        row: tuple,
        first_token: mx.array,
        logprobs: mx.array,
    ) -> int:
        """Add a row whose cache holds its whole prompt and whose first token the runner sampled and emitted
        (``first_token`` uint32 ``(1,)``, its ``logprobs`` row): the generator feeds that token next, and its response
        for it is dropped; its uid."""
        with mx.stream(generator.stream):
            (uid,) = self._extend(
                generator, [seq], [cache], [row], [list(seq.prompt_token_ids)], first_token, [logprobs], echo=False
            )
        self._emitted_ahead.add(uid)
        return uid

    @staticmethod
    def _extend(
        generator: BatchGenerator,
        seqs: Sequence[Any],
        caches: Sequence[list[Any]],
        rows: Sequence[tuple],
        tokens: list[list[int]],
        next_tokens: mx.array,
        next_logprobs: list[mx.array],
        *,
        echo: bool,
    ) -> list[int]:
        """Extend the generation batch with rows that have run no step: ``tokens`` are in each one's cache, and
        ``next_tokens`` are what it feeds next, as if it had sampled them (``echo``: their last prompt tokens, whose
        responses are dropped and do not count); their uids."""
        n = len(seqs)
        uids = list(range(generator._uid_count, generator._uid_count + n))
        generator._uid_count += n
        stop_sequences = [row[2] for row in rows]
        batch = GenerationBatch.empty(generator.model, generator.sampler)
        batch.uids = uids
        batch.prompt_cache = _merge_caches(list(caches))
        batch.tokens = tokens
        batch.samplers = [row[0] for row in rows]
        batch.logits_processors = [tuple(row[1]) if row[1] else () for row in rows]
        batch.max_tokens = [seq.max_new_tokens for seq in seqs]
        batch.stop_sequences = stop_sequences
        batch._next_tokens = next_tokens
        batch._next_logprobs = next_logprobs
        batch._token_context = [TokenBuffer(t) for t in tokens]
        batch._num_tokens = [-1 if echo else 0] * n  # an echo counts one
        batch._matchers = [_SkipFirst(s.matcher()) if echo else s.matcher() for s in stop_sequences]
        generator._generation_batch.extend(batch)
        return uids

    def first_tokens(self, generator: BatchGenerator, uids: Sequence[int]) -> list[tuple[int, int, mx.array]]:
        """(uid, token, logprob row) of each row in ``uids`` whose prompt the last step ended: its first sampled
        token, which the generator would hand out a step later (that response is then dropped)."""
        if not uids:
            return []
        batch = generator._generation_batch
        index = {uid: i for i, uid in enumerate(batch.uids)}
        present = [uid for uid in uids if uid in index]
        if not present:
            return []
        rows = [batch._next_logprobs[index[uid]] for uid in present]
        mx.eval(batch._next_tokens, rows)
        tokens = batch._next_tokens.tolist()
        self._emitted_ahead.update(present)
        return [(uid, tokens[index[uid]], row) for uid, row in zip(present, rows, strict=True)]

    def take_echo(self, uid: int) -> bool:
        """Whether this response of ``uid`` is its echoed prompt token (to drop); true once per joined row."""
        if uid in self._echo_pending:
            self._echo_pending.discard(uid)
            return True
        return False

    def take_emitted(self, uid: int) -> bool:
        """Whether this response of ``uid`` carries the first token :meth:`first_tokens` emitted (to drop)."""
        if uid in self._emitted_ahead:
            self._emitted_ahead.discard(uid)
            return True
        return False

    def forget(self, uids: Sequence[int]) -> None:
        """These rows left before their dropped responses."""
        self._echo_pending.difference_update(uids)
        self._emitted_ahead.difference_update(uids)
