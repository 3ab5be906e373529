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
run on, so every rank issues them in the same order. A follower's zero depends on its own
logits: its broadcast cannot be scheduled before the forward pass's collectives.

Pipeline stages prefill through mlx-lm's own prompt path, not the runner's
(worker/batched/prefill.py): with the runner's chunks beside decoding rows, the stages
were seen to wait on each other's transfers in different orders (one in a ``recv``, the
other in the step's ``all_gather``) and hang until the collective timeout.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.generate import StopSequences

from .batched.runner import BatchRunner
from .runner_base import LiveSequence
from .sampling import Sampler


def rank_zero_token(group: Any, stream: Any, sampler: Sampler | None) -> Sampler:
    """A row's sampler on a sharded model: ``sampler``'s token on rank 0 (``sampler`` None on
    the other ranks, which contribute zero), summed over ``group``: rank 0's token everywhere."""

    def sample(logprobs: mx.array) -> mx.array:
        if sampler is None:
            own = mx.argmax(logprobs, axis=-1) * 0  # zero, after this rank's forward pass
        else:
            own = sampler(logprobs)
        total = mx.distributed.all_sum(own.astype(mx.int32), group=group, stream=stream)
        return total.astype(mx.uint32)

    return sample


class ShardedBatchRunner(BatchRunner):
    """:class:`BatchRunner` on this rank's shard, every row sampled on rank 0 and broadcast."""

    def __init__(self, cfg, *, group: Any, request_waiting=None):
        super().__init__(cfg, request_waiting=request_waiting)
        self._group = group
        self._samples_here = group.rank() == 0
        self._pipelined = cfg.distributed.pipeline > 1

    def _start(self, model) -> None:
        super()._start(model)
        if self._pipelined:  # mlx-lm's prompt path (see the module's docstring)
            self._prefill, self._sizer = None, None

    def _row(self, live: LiveSequence) -> tuple:
        """Rank 0: the row a single process builds, its sampler's token broadcast. Other ranks:
        no processors (rank 0's token already obeys them), only the broadcast's receiving end."""
        assert self._generator is not None
        stream = self._generator.stream
        if self._samples_here:
            sampler, processors, stops = super()._row(live)
            return rank_zero_token(self._group, stream, sampler), processors, stops
        stop_ids = tuple(sorted(live.termination.stop_ids))
        return rank_zero_token(self._group, stream, None), [], StopSequences([[t] for t in stop_ids] or None)
