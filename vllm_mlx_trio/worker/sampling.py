"""Per-request samplers and logits processors, built on the MLX thread.

Each sampled request owns its PRNG key: a seeded request draws the same tokens whatever
else runs, and one request's draws never shift another's. mlx-lm's filters do the math.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from ..core.params import SamplingParams

Sampler = Callable[[mx.array], mx.array]

#: Tokens of recent context the repetition penalty looks at (mlx-lm's default).
REPETITION_CONTEXT_SIZE = 20


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def make_request_sampler(params: SamplingParams, vocab_size: int) -> Sampler:
    """Greedy for temperature 0; otherwise filtered categorical sampling with its own key."""
    if params.is_greedy:
        return greedy
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    key = mx.random.key(seed % 2**64)
    filters = _filters(params, vocab_size)
    inverse_temperature = 1.0 / params.temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        for apply in filters:
            logprobs = apply(logprobs)
        key, subkey = mx.random.split(key)
        return mx.random.categorical(logprobs * inverse_temperature, key=subkey)

    return sample


def _filters(params: SamplingParams, vocab_size: int) -> list[Callable[[mx.array], mx.array]]:
    filters = []
    if 0.0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0.0:
        filters.append(lambda x: apply_min_p(x, params.min_p))
    if 0 < params.top_k < vocab_size:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    return filters


def make_request_processors(params: SamplingParams) -> list:
    """Logits processors (repetition penalty) for one request; empty when none apply."""
    if params.repetition_penalty == 1.0:
        return []
    return make_logits_processors(
        repetition_penalty=params.repetition_penalty,
        repetition_context_size=REPETITION_CONTEXT_SIZE,
    )
