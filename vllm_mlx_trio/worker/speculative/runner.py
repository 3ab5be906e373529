"""The speculative runner (``speculative.method`` = "draft" or "mtp"): the batched runner plus, for sequences
inside the envelope (core/speculative.py), draft -> verify -> accept steps.

With a drafter that drafts for a batch (a draft model, an MTP head) and caches that roll back per row, every sequence
whose settings fit speculates, several rows in one round, beside the normal path's rows
(worker/speculative/batched_rows.py).
Otherwise (the one-row path, below) each step either runs the normal batched step (``BatchGenerator.next()``), or,
when exactly one sequence is live and its settings fit, one speculative round for it:

1. the drafter proposes up to ``num_draft_tokens`` drafts following the pending token (greedy, or sampled from the
   draft model's distribution for a sampled request);
2. one target forward of ``[pending, d1..dk]`` gives the target's logits after each position;
3. the verdict (worker/speculative/sampling.py, on the device): greedy, the longest prefix ``d1..da`` agreeing with the
   target's argmax; sampled, speculative rejection sampling. The emission is ``pending, d1..da`` (1..k+1 tokens)
   and the verdict's next token becomes the new pending token;
4. the target's cache drops the rejected drafts (trim, or the cache transaction for non-trimmable caches) and the
   drafter settles to match.

A round waits for the device once with a lazy drafter (both kinds here): the drafts stay on the device and feed the
verify lazily; a pipelined drafter (the draft model) also starts the next round's drafts before the host reads this
round's verdict.

For a greedy request the pending token is always the target's own greedy token, and every emitted draft equals the
target's greedy token at its position, so the output is the normal path's, token for token (up to rounding
differences between a one-token and a several-token forward); a sampled request's output is distributed as the
target's own sampling. The one termination rule (RunnerBase) cuts a run at a stop token or ``max_tokens``.

A sequence moves between the two paths (worker/speculative/moves.py) whenever the envelope changes: prompts are always
prefilled in the batch (so the prefix cache sees them as before); a second request arriving sends the speculating
one back into the batch, and it comes back once it is alone again.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from ...core.spec_rule import DraftRule
from ...core.speculative import SpecDecodeCounts, draft_budget, sampling_fits
from ...errors import ModelLoadError
from ...messages import KVReady, ModelInfo, StepPlan, StepResult
from ...runner_kinds import SPECULATIVE, RunnerShape
from ..batched.runner import BatchRunner
from ..runner_base import Advance, Emission, LiveSequence
from ..sampling import make_request_sampler
from . import hidden as target_hidden
from .batch_txn import batch_rollback_problem
from .batched_rows import BatchedRows
from .cache_txn import open_transaction, rollback_problem
from .drafter import CacheTransaction, Drafter, drafter_loader
from .entry_hidden import EntryHidden
from .moves import SpecSequence, put_into_batch, take_from_batch
from .mtp.thinking import ThinkingGate, gate_for
from .sampling import SpecSampler, greedy_verdict
from .spec_batch import SpecBatch, SpecRow

logger = logging.getLogger(__name__)


class TrimTransaction:
    """The cache transaction of a trimmable cache: drop the rejected inputs from its end."""

    def __init__(self, cache: list[Any], num_inputs: int):
        self._cache, self._num_inputs = cache, num_inputs

    def keep(self, num_tokens: int) -> None:
        trim_prompt_cache(self._cache, self._num_inputs - num_tokens)


class SpecRunner(BatchedRows, BatchRunner):
    """Batched runner + speculative rounds: for every row that fits, batched (worker/speculative/batched_rows.py)
    when the drafter drafts for a batch and the caches roll back per row; else for a sequence alone in the batch."""

    kind = SPECULATIVE

    @classmethod
    def shape(cls, cfg) -> RunnerShape:
        """The batched runner's, with a step giving up to ``num_draft_tokens + 1`` tokens: the scheduler's KV
        lookahead covers a whole round."""
        return attrs.evolve(super().shape(cfg), max_tokens_per_step=cfg.speculative.num_draft_tokens + 1)

    def __init__(self, cfg, *, drafter: Drafter | None = None, request_waiting=None):
        super().__init__(cfg, request_waiting=request_waiting)
        self._num_draft_tokens = cfg.speculative.num_draft_tokens
        self._drafter = drafter
        self._speculating: LiveSequence | None = None  # the sequence the drafter started on
        self._counts = SpecDecodeCounts()
        self._target_forward: Any = None
        self._thinking: ThinkingGate | None = None
        self._lazy = False  # the drafter is a LazyDrafter (set by _load)
        self._pipelined = False  # ... and a PipelinedDrafter
        self._entry_hidden: EntryHidden | None = None  # hidden states from the batch, for drafters that need them
        self._spec_batch: SpecBatch | None = None  # the batched path's rows (None: the one-row path)
        self._rule: DraftRule | None = None
        self._burst_waits = False  # this plan prefilled part of a burst of prompts: no round runs

    def _load(self) -> ModelInfo:
        info = super()._load()
        assert self._generator is not None
        self._target = self._generator.model
        method = self._cfg.speculative.method
        if self._drafter is None:
            self._drafter = self._load_drafter(info)
        problem = rollback_problem(self._target)
        if problem is not None:
            raise ModelLoadError(f"speculative.method = {method!r} needs to drop rejected drafts, but {problem}")
        if self._drafter.needs_target_hidden:
            self._target_forward = target_hidden.target_forward  # looked up now: a test may spy on it
            self._entry_hidden = EntryHidden(
                self._target,
                self._generator,
                self._drafter.hidden_state_mode,
                limit=self._cfg.speculative.mtp_context_tokens,
                request_of=self._request_ids,
            )
            if self._prefill is not None:
                self._prefill.recorder = self._entry_hidden
        self._lazy = hasattr(self._drafter, "propose_lazy")  # a LazyDrafter: one sync a round, sampled drafts
        self._pipelined = self._lazy and hasattr(self._drafter, "draft_ahead")
        if (
            self._cfg.speculative.method == "mtp"
        ):  # thinking requests and MTP (MTP's hook, worker/speculative/mtp/thinking.py)
            self._thinking = gate_for(self._cfg, info.tokenizer)
        draft_batch = getattr(self._drafter, "batch", None)  # a drafter that drafts for several rows at once
        if self._batches_rows() and draft_batch is not None and batch_rollback_problem(self._target) is None:
            drafts = draft_batch()  # None: the drafter's cache does not roll back per row
            self._spec_batch = None if drafts is None else SpecBatch(self._target, drafts, self._batch_forward(drafts))
            self._rule = DraftRule(self._num_draft_tokens)
        return info

    def _batches_rows(self) -> bool:
        """Whether several rows may speculate in one round: this runner's own kind, without a thinking gate (rows
        never leave the batched path). A runner of another kind built on this one (the vlm runner's) keeps the
        one-row envelope its own ``_fits`` states."""
        return self.kind == SPECULATIVE and self._thinking is None

    def _batch_forward(self, drafts: Any):
        """The batched verify forward: with the target's hidden states when the drafter reads them."""
        if not drafts.needs_target_hidden:
            return None
        forward, mode = self._target_forward, drafts.hidden_state_mode
        return lambda inputs, cache: forward(self._target, inputs, cache, mode=mode)

    def _load_drafter(self, info: ModelInfo) -> Drafter:
        """``speculative.method``'s drafter for the loaded target (on the MLX thread)."""
        method = self._cfg.speculative.method
        try:
            load = drafter_loader(method)
        except ImportError as exc:  # boundary: a method whose drafter is not installed
            raise ModelLoadError(f"speculative.method = {method!r} is not available: {exc}") from exc
        return load(self._cfg, self._target, info)

    # -- the step ------------------------------------------------------------------------------

    def execute(self, plan: StepPlan) -> StepResult:
        result = super().execute(plan)
        counts, self._counts = self._counts, SpecDecodeCounts()
        return attrs.evolve(result, spec_decode=counts) if counts.num_drafts else result

    def _advance(self, live: list[LiveSequence]) -> Advance:
        if self._spec_batch is not None:
            return self._batched_advance(live)
        emissions = []
        current = self._speculating
        if current is not None and not self._fits(current):
            emissions.append(self._leave(current))
            current = None
        if current is None:
            current = self._candidate()
            if current is not None:
                self._enter(current)
        if current is not None:
            emission = self._round(current)
            return Advance([emission] if emission is not None else [])
        advance = super()._advance(live)
        return Advance([*emissions, *advance.emissions], advance.prompts_done)

    def _batched_advance(self, live: list[LiveSequence]) -> Advance:
        """Rows that may speculate join the speculative batch; the generator's step for the rest and the prompts;
        one speculative round for the batch."""
        assert self._spec_batch is not None
        entering = self._batch_candidates()
        if entering:
            self._batch_enter(entering)
        advance, self._burst_waits = Advance(), False
        if self._request_ids or (self._prefill is not None and self._prefill.head is not None):
            advance = super()._advance(live)
        # while more of a burst of prompts waits, no row decodes (as on the normal path): they start together
        emissions = self._batch_round() if self._spec_batch.rows and not self._burst_waits else []
        return Advance([*advance.emissions, *emissions], advance.prompts_done)

    def _prefill_step(self):
        prompts_done = super()._prefill_step()
        self._burst_waits = bool(self._sampled_first)  # the plan ends with the burst's first tokens
        return prompts_done

    def _may_run_ahead(self, advance: Advance, live: list[LiveSequence], steps: int) -> bool:
        """No plain run-ahead step while a row speculates or could: the round waits for it."""
        if self._spec_batch is not None and (self._spec_batch.rows or self._batch_candidates()):
            return False
        return self._candidate() is None and super()._may_run_ahead(advance, live, steps)

    def _fits(self, sequence: LiveSequence) -> bool:
        return (
            len(self._live) == 1
            and sampling_fits(sequence.seq.params, sequence.num_output_tokens, sampled=self._lazy)
            and (self._thinking is None or self._thinking_allows(sequence))
        )

    def _thinking_allows(self, sequence: LiveSequence) -> bool:
        assert self._thinking is not None
        seq = sequence.seq
        prompt = seq.prompt_token_ids[: len(seq.prompt_token_ids) - seq.num_output_tokens]
        return self._thinking.allows(seq, prompt, [*seq.output_token_ids, *sequence.emitted])

    def _candidate(self) -> LiveSequence | None:
        """The one live sequence, if it fits the envelope and is decoding in the batch (past its prompt)."""
        if len(self._live) != 1 or self._spec_batch is not None:
            return None
        (sequence,) = self._live.values()
        if sequence.handle not in self._decoding or not self._fits(sequence):
            return None
        return sequence

    def _enter(self, sequence: LiveSequence) -> None:
        assert self._generator is not None and self._drafter is not None
        uid = sequence.handle
        spec = take_from_batch(self._generator, uid)
        if not sequence.seq.params.is_greedy:
            assert self._info is not None
            spec.sampler = SpecSampler(sequence.seq.params, self._info.vocab_size)
        del self._request_ids[uid]
        self._decoding.discard(uid)
        sequence.handle = spec
        self._speculating = sequence
        hidden = None if self._entry_hidden is None else self._entry_hidden.take(sequence.request_id)
        self._drafter.start(self._cached_tokens(sequence), hidden)

    def _leave(self, sequence: LiveSequence) -> Emission:
        """Back to the batch: emit the pending token; the generator carries on after it."""
        assert self._generator is not None and self._drafter is not None
        spec: SpecSequence = sequence.handle
        self._stop_drafter()
        tokens = (spec.pending,)
        _keep, reason = sequence.termination.scan(sequence.num_output_tokens, tokens)
        if reason is None:  # else the rule ends it on this token: it stays here until RunnerBase drops it
            assert self._info is not None
            tokens_left = sequence.termination.max_tokens - sequence.num_output_tokens - 1
            sampler = make_request_sampler(sequence.seq.params, self._info.vocab_size)  # unseeded: a fresh key
            uid = put_into_batch(
                self._generator,
                spec,
                self._cached_tokens(sequence),
                tokens_left,
                sequence.termination.stop_ids,
                sampler,
            )
            sequence.handle = uid
            self._request_ids[uid] = sequence.request_id
        return Emission(sequence.request_id, tokens)

    def _round(self, sequence: LiveSequence) -> Emission | None:
        """One draft -> verify -> accept round; None if the request failed (recorded in ``failures``)."""
        try:
            return self._speculate(sequence)
        except Exception as exc:  # boundary: a drafter's failure ends this request only
            logger.exception("speculative round failed for request %s", sequence.request_id)
            self.failures[sequence.request_id] = f"speculative decoding failed: {type(exc).__name__}: {exc}"
            return None

    def _speculate(self, sequence: LiveSequence) -> Emission:
        """One round, synchronising host and device once: the drafts stay on the device, feed the verify forward
        lazily, the verdict is computed there, and all three are read together; a pipelined drafter starts the
        next round's drafts (from the verdict's next token) before that read."""
        assert self._drafter is not None and self._generator is not None
        spec: SpecSequence = sequence.handle
        tokens_left = sequence.termination.max_tokens - sequence.num_output_tokens
        budget = draft_budget(self._num_draft_tokens, tokens_left)
        pick = None if spec.sampler is None else spec.sampler.pick
        with mx.stream(self._generator.stream):
            drafts = self._propose(spec.pending, budget, pick)
            inputs = mx.concatenate([mx.array([spec.pending], dtype=mx.uint32), drafts])
            transaction = self._transaction(spec.cache, inputs)
            logits, hidden = self._verify(spec.cache, inputs)
            if spec.sampler is None:
                accepted_count, next_token = greedy_verdict(drafts, logits)
            else:
                draft_probs = spec.sampler.take_draft_probs(drafts.size)
                accepted_count, next_token = spec.sampler.verdict(drafts, draft_probs, logits)
            mx.async_eval(accepted_count, next_token)
            if self._pipelined and spec.all_accepted and drafts.size:
                next_budget = draft_budget(self._num_draft_tokens, tokens_left - drafts.size - 1)
                self._drafter.draft_ahead(drafts, next_token, next_budget, pick)  # type: ignore[attr-defined]
            num_accepted, draft_ids = int(accepted_count.item()), drafts.tolist()  # the round's one wait
            pending = int(next_token.item())
            transaction.keep(1 + num_accepted)
            self._drafter.settle(
                [*draft_ids[:num_accepted], pending], None if hidden is None else hidden[:, : num_accepted + 1]
            )
        spec.all_accepted = num_accepted == len(draft_ids)
        if spec.sampler is not None and not spec.all_accepted:
            spec.sampler.discard_draft_probs()  # picks of a round drafted ahead that did not stand
        emitted = (spec.pending, *draft_ids[:num_accepted])
        spec.pending = pending
        self._counts += SpecDecodeCounts.of_round(len(draft_ids), num_accepted)
        return Emission(sequence.request_id, emitted)

    def _propose(self, pending: int, budget: int, pick: Any) -> mx.array:
        """Up to ``budget`` drafts after ``pending``, as a uint32 array (lazy from a LazyDrafter)."""
        assert self._drafter is not None
        if self._lazy:
            return self._drafter.propose_lazy(pending, budget, pick)  # type: ignore[attr-defined]
        drafts = self._drafter.propose(pending, budget)[:budget] if budget else []
        return mx.array(drafts, dtype=mx.uint32)

    def _verify(self, cache: list[Any], inputs: mx.array) -> tuple[mx.array, mx.array | None]:
        """One target forward of ``inputs``: its logits ``(1, n, vocab)``, and the hidden states when the drafter
        wants them (lazy)."""
        assert self._drafter is not None
        if self._target_forward is not None:
            return self._target_forward(self._target, inputs[None], cache, mode=self._drafter.hidden_state_mode)
        return self._target(inputs[None], cache=cache), None

    def _transaction(self, cache: list[Any], inputs: mx.array) -> CacheTransaction:
        if can_trim_prompt_cache(cache):
            return TrimTransaction(cache, inputs.size)
        return open_transaction(self._target, cache, inputs)

    def _cached_tokens(self, sequence: LiveSequence) -> list[int]:
        """What the target's cache holds for a sequence: its prompt and every token emitted since."""
        return [*sequence.seq.prompt_token_ids, *sequence.emitted]

    def _stop_drafter(self) -> None:
        if self._speculating is not None and self._drafter is not None:
            self._speculating = None
            self._drafter.stop()

    # -- leaving the runner --------------------------------------------------------------------

    def _remove(self, live: list[LiveSequence]) -> None:
        if self._speculating is not None and any(s is self._speculating for s in live):
            self._stop_drafter()
        if self._entry_hidden is not None:
            for sequence in live:
                self._entry_hidden.forget(sequence.request_id)
        live = self._batch_remove(live)
        super()._remove([s for s in live if not isinstance(s.handle, SpecSequence)])

    def _finished_ready(self, live: LiveSequence, emission: Emission) -> KVReady | None:
        """A sequence finished on the speculative path: its prompt + output blocks from its own cache."""
        if isinstance(live.handle, SpecRow):
            return self._batch_finished_ready(live) if self._cfg.cache.store_generated else None
        if not isinstance(live.handle, SpecSequence):
            return super()._finished_ready(live, emission)
        if not self._cfg.cache.store_generated:
            return None
        first_block = len(live.seq.prompt_token_ids) // self._prefix.block_size
        assert self._generator is not None
        with mx.stream(self._generator.stream):
            return self._prefix.ready(live.request_id, tuple(self._cached_tokens(live)), live.handle.cache, first_block)

    def _close(self) -> None:
        self._stop_drafter()
        if self._entry_hidden is not None:
            self._entry_hidden.close()
            self._entry_hidden = None
        self._drafter = None
        self._spec_batch = None
        self._target = None
        super()._close()
