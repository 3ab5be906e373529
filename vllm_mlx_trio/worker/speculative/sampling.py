"""A speculative round's verdict, computed on the device: how many drafts stand and the token after them.

Greedy (:func:`greedy_verdict`): the drafts are accepted up to the first one that differs from the target's argmax
(of the log-softmax, as the batch's greedy sampler picks it); the next token is the target's argmax there.

Sampled (:class:`SpecSampler`, standard speculative rejection sampling): the draft model samples each draft ``x``
from its distribution ``q``; the target accepts it with probability ``min(1, p(x) / q(x))``; at the first rejection
the next token is drawn from ``norm(max(0, p - q))``, and after the last accepted draft from ``p`` (the bonus). The
tokens a round emits are then distributed exactly as the target's own sampling would draw them. ``p`` and ``q`` are
the request's distributions as the normal sampler (worker/sampling.py) makes them: log-softmax, its top_p / min_p /
top_k filters, its temperature. Each request has its own PRNG key, split once per draw. MLX thread only.
"""

from __future__ import annotations

import os

import mlx.core as mx

from ...core.params import SamplingParams
from ..sampling import sampling_filters


def greedy_verdict(drafts: mx.array, logits: mx.array) -> tuple[mx.array, mx.array]:
    """(number of drafts accepted, the target's token after them), lazy; ``logits`` ``(1, n + 1, vocab)``."""
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    target = mx.argmax(logprobs[0], axis=-1).astype(mx.uint32)
    agree = (drafts == target[: drafts.size]).astype(mx.int32)
    num_accepted = mx.cumprod(agree).sum() if drafts.size else mx.array(0, dtype=mx.int32)
    return num_accepted, target[num_accepted]


def rejection_verdict(drafts: mx.array, q: mx.array, p: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
    """Speculative rejection sampling of ``n`` drafts (drafted from the rows of ``q``, ``(n, vocab)``) against the
    target's ``p`` (``(n + 1, vocab)``): (drafts accepted, the next token), lazy."""
    num_drafts = drafts.size
    uniform_key, next_key = mx.random.split(key)
    if num_drafts:
        positions = mx.arange(num_drafts)
        p_draft, q_draft = p[positions, drafts], q[positions, drafts]
        accepted = mx.random.uniform(shape=(num_drafts,), key=uniform_key) * q_draft < p_draft  # u < p(x) / q(x)
        num_accepted = mx.cumprod(accepted.astype(mx.int32)).sum()
        residual = mx.maximum(p - mx.concatenate([q, mx.zeros((1, p.shape[-1]), dtype=q.dtype)]), 0.0)
    else:
        num_accepted, residual = mx.array(0, dtype=mx.int32), p
    row = residual[num_accepted]  # after the last draft the "residual" row is p itself: the bonus
    row = mx.where(row.sum() > 0, row, p[num_accepted])  # p == q exactly there: rejection had probability 0
    return num_accepted, mx.random.categorical(mx.log(row), key=next_key).astype(mx.uint32)


class SpecSampler:
    """One sampled request's drafting and verdict: its filters, temperature and PRNG key.

    :meth:`pick` is the draft model's token choice (it keeps each draft's ``q`` row, :meth:`take_draft_probs` hands
    the last ``n`` over); :meth:`verdict` judges a round against the target's logits.
    """

    def __init__(self, params: SamplingParams, vocab_size: int, *, seed: int | None = None):
        if params.temperature <= 0.0:
            raise ValueError("SpecSampler is for sampled requests (temperature > 0)")
        seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self._key = mx.random.key(seed % 2**64)
        self._filters = sampling_filters(params, vocab_size)
        self._inverse_temperature = 1.0 / params.temperature
        self._draft_probs: list[mx.array] = []

    def pick(self, logits: mx.array) -> mx.array:
        """Sample a draft from the draft model's ``logits`` ``(1, vocab)``: ``uint32`` of shape ``(1,)``."""
        scores = self._scores(logits).astype(mx.float32)  # q is exactly the distribution the draft is drawn from
        self._draft_probs.append(mx.softmax(scores, axis=-1))
        return mx.random.categorical(scores, key=self._next_key()).astype(mx.uint32)

    def take_draft_probs(self, num_drafts: int) -> mx.array:
        """The ``q`` rows of the last ``num_drafts`` picks, ``(num_drafts, vocab)``; earlier ones are dropped."""
        rows, self._draft_probs = self._draft_probs[len(self._draft_probs) - num_drafts :], []
        return mx.concatenate(rows) if rows else mx.zeros((0, 1), dtype=mx.float32)

    def discard_draft_probs(self) -> None:
        """Forget picks whose drafts were dropped (a round drafted ahead that did not stand)."""
        self._draft_probs = []

    def verdict(self, drafts: mx.array, draft_probs: mx.array, logits: mx.array) -> tuple[mx.array, mx.array]:
        """:func:`rejection_verdict` of ``drafts`` against the target's ``logits`` ``(1, n + 1, vocab)``."""
        p = mx.softmax(self._scores(logits[0]).astype(mx.float32), axis=-1)
        return rejection_verdict(drafts, draft_probs, p, self._next_key())

    def _scores(self, logits: mx.array) -> mx.array:
        """What the normal sampler draws from: the log-softmax, filtered, over the temperature."""
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        for apply in self._filters:
            logprobs = apply(logprobs)
        return logprobs * self._inverse_temperature

    def _next_key(self) -> mx.array:
        self._key, subkey = mx.random.split(self._key)
        return subkey
