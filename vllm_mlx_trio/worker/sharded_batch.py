"""The batched runner on one rank of a sharded model: every row's token is sampled once, on
rank 0, and broadcast.

Every rank computes the same logits (the model's own collectives), but only rank 0 holds what
sampling needs beyond them: each request's sampler (its PRNG key), its logits processors
(penalties, ``logit_bias``, ``min_tokens``, the thinking budget) and its compiled grammar (an
llguidance matcher, which cannot cross processes). So rank 0 samples each row as a single
process would, and every rank then takes the token from one ``all_sum`` in which the other
ranks add zero: the token every rank feeds next, counts toward ``max_tokens`` and checks
against the stop ids is rank 0's. The other ranks build no sampler and no processor at all,
so they never need to agree on a sampler's state.

The broadcast is one ``all_sum`` of the whole batch's tokens per generator step, on the stream
the model's collectives run on, as soon as the step has sampled them and before anything reads
them (:meth:`ShardedBatchRunner._sampled`). A follower's zeros depend on its own logits
(:func:`zero_token`), and so does rank 0's token (:func:`after_forward`): the broadcast
cannot be scheduled before the forward pass's collectives on any rank.

Every rank must evaluate the same collectives in the same order, so every choice that shapes a
step is made alike on every rank: no burst (:meth:`ShardedBatchRunner._burst_row`), no
run-ahead (the batched runner's, decided at load), and nothing left unevaluated on one rank
that another evaluates (:func:`after_forward`).
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import StopSequences

from .batched.runner import BatchRunner
from .runner_base import LiveSequence
from .sampling import LogitsProcessor


def zero_token(logprobs: mx.array) -> mx.array:
    """Every row's sampler on the ranks other than 0 (one function, so the batch is sampled in
    one call): a zero per row that depends on this rank's logits, so the step's broadcast comes
    after its forward pass."""
    return (mx.argmax(logprobs, axis=-1) * 0).astype(mx.uint32)


def after_forward(processors: list[LogitsProcessor]) -> list[LogitsProcessor]:
    """``processors`` whose output always depends on the logits they were given: a processor
    may replace them outright (a grammar that must end allows its stop ids whatever the model
    says), and then rank 0 would never evaluate that step's forward pass, whose collectives the
    other ranks wait on."""
    if not processors:
        return processors
    given: list[mx.array] = []

    def keep(context: mx.array, logits: mx.array) -> mx.array:
        given[:] = [logits]
        return logits

    def attach(context: mx.array, logits: mx.array) -> mx.array:
        return mx.depends(logits, given[0])

    return [keep, *processors, attach]


class ShardedBatchRunner(BatchRunner):
    """:class:`BatchRunner` on this rank's shard, every row sampled on rank 0 and broadcast."""

    def __init__(self, cfg, *, group: Any, request_waiting=None):
        super().__init__(cfg, request_waiting=request_waiting)
        self._group = group
        self._samples_here = group.rank() == 0

    def _burst_row(self, head) -> None:
        """No burst (worker/batched/prefill_burst.py): its first token would be sampled outside the
        generator's step, whether a row takes it depends on its processors, which only rank 0
        builds, and its last chunk computes the last position only, which changes the shape a
        pipeline stage sends: every rank must run the same forward passes."""
        return None

    def _row(self, live: LiveSequence) -> tuple:
        """Rank 0: the row a single process builds. Other ranks: no sampler and no processors
        (rank 0's token already obeys them), a zero in the step's broadcast."""
        if self._samples_here:
            sampler, processors, stops = super()._row(live)
            return sampler, after_forward(processors), stops
        stop_ids = tuple(sorted(live.termination.stop_ids))
        return zero_token, [], StopSequences([[t] for t in stop_ids] or None)

    def _sampled(self) -> None:
        """Every row's next token becomes rank 0's: one ``all_sum`` of the batch's tokens, in
        which the other ranks add zeros, before the generator or the runner reads them."""
        assert self._generator is not None
        batch = self._generator._generation_batch  # mlx-lm's fields, as generator_join.py reads them
        tokens = batch._next_tokens
        if tokens is None or tokens.size == 0:
            return
        with mx.stream(self._generator.stream):
            total = mx.distributed.all_sum(tokens.astype(mx.int32), group=self._group, stream=self._generator.stream)
            batch._next_tokens = total.astype(tokens.dtype)
        mx.async_eval(batch._next_tokens)
