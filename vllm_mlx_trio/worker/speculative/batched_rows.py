"""The speculative runner's batched path: every decoding row that may speculate does, several in one round.

Used when the drafter can draft for a batch (a draft model, worker/speculative/draft_batch.py; an MTP head,
worker/speculative/mtp/batch.py) and the target's rows roll back one by one (worker/speculative/batch_txn.py, checked
at load); otherwise the runner keeps the one-row path (worker/speculative/runner.py). Each step:

1. rows that decode in mlx-lm's generator and fit the envelope's per-request part (core/speculative.py:
   :func:`~vllm_mlx_trio.core.speculative.sampling_fits`; the number of running requests no longer matters) move into
   the :class:`~.spec_batch.SpecBatch` with their cache and pending token (worker/speculative/moves.py); prompts are
   prefilled in the generator as on the normal path, so the prefix cache sees them as before;
2. the generator's own step runs for the rows that may not speculate (logprobs, penalties, processors, seeds) and for
   the prompts being prefilled, as the batched runner runs it (no run-ahead while rows speculate: a run-ahead step
   would make them wait);
3. one speculative round runs for all speculating rows, with the number of drafts the per-step rule
   (core/spec_rule.py) picks from the measured round times and acceptance; none while a prompt is being prefilled
   (the rows then step at the normal path's pace, so the prompt's first token does not wait for rounds several
   decode steps long).

A row stays on the speculative path until it ends: the per-request part of the envelope only ever opens (a
``min_tokens`` reached). A finished row's prompt and output go to the prefix store from its own cache, as on the
normal path. MLX thread only.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import mlx.core as mx

from ...core.spec_rule import DraftRule
from ...core.speculative import sampling_fits
from ...messages import KVReady
from ..runner_base import Emission, LiveSequence
from .moves import take_from_batch
from .sampling import SpecSampler
from .spec_batch import SpecBatch, SpecRow, round_counts

logger = logging.getLogger(__name__)


class BatchedRows:
    """The batched path's state and steps; a mixin of the speculative runner (it reaches the runner's generator,
    live sequences and spec-decode counts)."""

    _spec_batch: SpecBatch | None
    _rule: DraftRule | None
    _generator: Any
    _live: dict
    _decoding: set
    _request_ids: dict
    _info: Any
    _prefix: Any
    failures: dict
    _counts: Any

    def _batch_candidates(self) -> list[LiveSequence]:
        """Sequences decoding in the generator whose settings let them speculate."""
        return [
            sequence
            for sequence in self._live.values()
            if isinstance(sequence.handle, int)
            and sequence.handle in self._decoding
            and sampling_fits(sequence.seq.params, sequence.num_output_tokens, sampled=True)
        ]

    def _batch_enter(self, sequences: list[LiveSequence]) -> None:
        """Move decoding rows from the generator into the speculative batch."""
        assert self._spec_batch is not None and self._info is not None
        rows, caches, hiddens = [], [], []
        entry_hidden = getattr(self, "_entry_hidden", None)
        for sequence in sequences:
            uid = sequence.handle
            spec = take_from_batch(self._generator, uid)
            del self._request_ids[uid]
            self._decoding.discard(uid)
            params = sequence.seq.params
            sampler = None if params.is_greedy else SpecSampler(params, self._info.vocab_size)
            row = SpecRow(
                sequence.request_id, [*sequence.seq.prompt_token_ids, *sequence.emitted], spec.pending, sampler
            )
            sequence.handle = row
            rows.append(row)
            caches.append(spec.cache)
            hiddens.append(None if entry_hidden is None else entry_hidden.take(sequence.request_id))
        with mx.stream(self._generator.stream):
            self._spec_batch.add(rows, caches, hiddens)

    def _batch_round(self) -> list[Emission]:
        """One round for every speculating row; a failure fails those rows only."""
        assert self._spec_batch is not None and self._rule is not None
        batch = self._spec_batch
        rows = list(batch.rows)
        tokens_left = [self._live[row.request_id].termination.max_tokens for row in rows]
        tokens_left = [
            left - self._live[row.request_id].num_output_tokens for left, row in zip(tokens_left, rows, strict=True)
        ]
        # while a prompt is being prefilled, rows step at the normal path's pace: a round of drafts takes several
        # decode steps' time, and the waiting prompt's first token would wait for every one of them
        num_drafts = 0 if self._prompt_waits() else self._rule.choose(len(rows))
        started = time.perf_counter()
        try:
            with mx.stream(self._generator.stream):
                results = batch.round(num_drafts, tokens_left)
        except Exception as exc:  # boundary: a model's or drafter's failure ends these requests only
            logger.exception("batched speculative round failed")
            for row in rows:
                self.failures[row.request_id] = f"speculative decoding failed: {type(exc).__name__}: {exc}"
            batch.remove(rows)
            return []
        self._rule.observe(
            len(rows), num_drafts, time.perf_counter() - started, [(r.num_proposed, r.num_accepted) for r in results]
        )
        self._counts += round_counts(results)
        return [Emission(r.row.request_id, r.tokens) for r in results]

    def _prompt_waits(self) -> bool:
        """Whether a prompt is being prefilled (by the runner's own prefill, or in the generator)."""
        prefill = getattr(self, "_prefill", None)
        return (prefill is not None and prefill.head is not None) or len(self._decoding) < len(self._request_ids)

    def _batch_remove(self, live: list[LiveSequence]) -> list[LiveSequence]:
        """Drop the speculating rows among ``live``; the rest, for the generator's side."""
        rows = [sequence.handle for sequence in live if isinstance(sequence.handle, SpecRow)]
        if rows and self._spec_batch is not None:
            self._spec_batch.remove(rows)
        return [sequence for sequence in live if not isinstance(sequence.handle, SpecRow)]

    def _batch_finished_ready(self, live: LiveSequence) -> KVReady | None:
        """A speculating row finished: its prompt + output blocks, from a copy of its cache."""
        assert self._spec_batch is not None
        first_block = len(live.seq.prompt_token_ids) // self._prefix.block_size
        tokens = (*live.seq.prompt_token_ids, *live.emitted)
        with mx.stream(self._generator.stream):
            cache = self._spec_batch.extract(live.handle)
            return self._prefix.ready(live.request_id, tokens, cache, first_block)
