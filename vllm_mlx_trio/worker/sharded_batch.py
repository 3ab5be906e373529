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

The broadcast is part of each row's sampler (mlx-lm samples row by row once the rows' samplers
differ), one ``all_sum`` of one token per row and step, on the stream the model's collectives
run on, chained so every rank issues them in the same order (:class:`TokenBroadcast`). A
follower's zero depends on its own logits: its broadcast cannot be scheduled before the
forward pass's collectives, and so does rank 0's token (:func:`after_forward`).

Pipeline stages prefill through mlx-lm's own prompt path, not the runner's
(worker/batched/prefill.py): with the runner's chunks, the stages were seen to issue their
transfers in different orders (one rank in a ``recv``, the other in the step's
``all_gather``) and hang, or mix up a plan's bytes with a step's.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import StopSequences

from .batched.runner import BatchRunner
from .runner_base import LiveSequence
from .sampling import LogitsProcessor, Sampler


class TokenBroadcast:
    """Rows' tokens from rank 0 to every rank, one ``all_sum`` per row and step, chained: each
    row's sum waits for the one before it, so every rank runs them in the same order whatever
    its rows' sampling graphs look like (rank 0's carry processors and grammar masks, the other
    ranks' do not: left to itself, MLX may order two independent sums differently on each rank,
    and a row would get another row's token)."""

    def __init__(self, group: Any, stream: Any):
        self._group = group
        self._stream = stream
        self._last: mx.array | None = None

    def row_sampler(self, sampler: Sampler | None) -> Sampler:
        """A row's sampler: ``sampler``'s token on rank 0 (None on the other ranks, which add
        zero), summed over the group: rank 0's token on every rank."""

        def sample(logprobs: mx.array) -> mx.array:
            if sampler is None:
                own = mx.argmax(logprobs, axis=-1) * 0  # zero, after this rank's forward pass
            else:
                own = sampler(logprobs)
            own = own.astype(mx.int32)
            if self._last is not None:
                own = mx.depends(own, self._last)
            self._last = mx.distributed.all_sum(own, group=self._group, stream=self._stream)
            return self._last.astype(mx.uint32)

        return sample


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
        self._broadcast: TokenBroadcast | None = None
        self._pipelined = cfg.distributed.pipeline > 1

    def _start(self, model) -> None:
        super()._start(model)
        assert self._generator is not None
        self._broadcast = TokenBroadcast(self._group, self._generator.stream)
        if self._pipelined:  # mlx-lm's prompt path (see the module's docstring)
            self._prefill, self._sizer = None, None

    def _burst_row(self, head) -> None:
        """No burst (worker/batched/prefill_burst.py): its first token would be sampled outside the
        generator's step, and whether a row takes it depends on its processors, which only
        rank 0 builds: every rank must run the same forward passes."""
        return None

    def _row(self, live: LiveSequence) -> tuple:
        """Rank 0: the row a single process builds, its sampler's token broadcast. Other ranks:
        no processors (rank 0's token already obeys them), only the broadcast's receiving end."""
        assert self._broadcast is not None
        if self._samples_here:
            sampler, processors, stops = super()._row(live)
            return self._broadcast.row_sampler(sampler), after_forward(processors), stops
        stop_ids = tuple(sorted(live.termination.stop_ids))
        return self._broadcast.row_sampler(None), [], StopSequences([[t] for t in stop_ids] or None)
