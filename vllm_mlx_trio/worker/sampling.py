"""Per-request samplers, logits processors and logprobs, built and run on the MLX thread.

Each sampled request owns its PRNG key: a seeded request draws the same tokens whatever
else runs, and one request's draws never shift another's. mlx-lm's filters do the math.

Processors have mlx-lm's signature ``(context, logits) -> logits`` and are called once per
generated token, in both modes: on the i-th call (from 0) the context ends with the i
tokens generated so far (for i > 0, ``context[-1]`` is the newest one). Processors that need
the generated tokens alone count their calls rather than trusting the context's length.
A runner that accepts several tokens per step (speculative decoding) must call them, and draw
from the sampler, once per accepted token, so ``min_tokens``, the penalties and a preempted
request's PRNG advance (``num_drawn``) all count tokens, not steps.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_repetition_penalty

from ..core.params import SamplingParams
from ..core.thinking_budget import ThinkingBudget, ThinkingBudgetTracker
from ..messages import TokenLogprob
from .grammar_mask import grammar_processor

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]

#: Tokens of recent context the repetition penalty looks at (mlx-lm's default).
REPETITION_CONTEXT_SIZE = 20


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def make_request_sampler(params: SamplingParams, vocab_size: int, num_drawn: int = 0) -> Sampler:
    """Greedy for temperature 0; otherwise filtered categorical sampling with its own key.

    Every greedy request shares the one :func:`greedy` function, so a batch of greedy rows
    is sampled in one call. ``num_drawn`` draws are skipped: a preempted request resumes
    its key where it stopped, so a seeded request draws the same tokens either way.
    """
    if params.is_greedy:
        return greedy
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    key = mx.random.key(seed % 2**64)
    for _ in range(num_drawn):
        key, _subkey = mx.random.split(key)
    filters = sampling_filters(params, vocab_size)
    inverse_temperature = 1.0 / params.temperature

    def sample(logprobs: mx.array) -> mx.array:
        nonlocal key
        for apply in filters:
            logprobs = apply(logprobs)
        key, subkey = mx.random.split(key)
        return mx.random.categorical(logprobs * inverse_temperature, key=subkey)

    return sample


def sampling_filters(params: SamplingParams, vocab_size: int) -> list[Callable[[mx.array], mx.array]]:
    """The request's top_p, min_p and top_k filters on log-probabilities, in the order the sampler applies them."""
    filters = []
    if 0.0 < params.top_p < 1.0:
        filters.append(lambda x: apply_top_p(x, params.top_p))
    if params.min_p > 0.0:
        filters.append(lambda x: apply_min_p(x, params.min_p))
    if 0 < params.top_k < vocab_size:
        filters.append(lambda x: apply_top_k(x, params.top_k))
    return filters


def make_request_processors(
    params: SamplingParams, *, stop_ids: tuple[int, ...], generated: tuple[int, ...] = ()
) -> list[LogitsProcessor]:
    """Every logits processor one request needs, in vLLM's order; empty when none apply.

    ``stop_ids`` are the ids that end the request (EOS unless ignored, stop_token_ids):
    ``min_tokens`` keeps them from being sampled early. ``generated`` are the tokens a
    preempted request produced before (they count toward min_tokens and the penalties, and
    are replayed into a constraint's fresh matcher). The grammar mask comes last, so no
    processor after it can lift a token it forbade.
    """
    processors: list[LogitsProcessor] = []
    if params.logit_bias:
        processors.append(_logit_bias(params.logit_bias))
    if params.min_tokens > len(generated) and stop_ids:
        processors.append(_min_tokens(params.min_tokens - len(generated), stop_ids))
    if params.presence_penalty or params.frequency_penalty:
        processors.append(_output_penalties(params.presence_penalty, params.frequency_penalty, generated))
    if params.repetition_penalty != 1.0:
        processors.append(make_repetition_penalty(params.repetition_penalty, REPETITION_CONTEXT_SIZE))
    if params.thinking_budget is not None:
        processors.append(thinking_budget_processor(params.thinking_budget, generated))
    if params.constraint is not None:
        processors.append(_constraint(params, stop_ids, generated))
    return processors


def _constraint(params: SamplingParams, stop_ids: tuple[int, ...], generated: tuple[int, ...]) -> LogitsProcessor:
    """The grammar mask admission compiled; a spec that reached the MLX thread uncompiled fails its request."""
    if params.grammar is None:

        def uncompiled(context: mx.array, logits: mx.array) -> mx.array:
            raise RuntimeError("the request's constraint was not compiled at admission")

        return uncompiled
    return grammar_processor(params.grammar, stop_ids=stop_ids, generated=generated)


def thinking_budget_processor(budget: ThinkingBudget, generated: tuple[int, ...]) -> LogitsProcessor:
    """Forces the thinking block's end marker once ``budget`` tokens were spent inside it.
    Like the grammar mask, each call after the first advances by the token sampled last."""
    tracker = ThinkingBudgetTracker(budget, generated)
    calls = 0

    def limit(context: mx.array, logits: mx.array) -> mx.array:
        nonlocal calls
        if calls > 0:
            tracker.feed(int(context[-1].item()))
        calls += 1
        forced = tracker.forced()
        if forced is None:
            return logits
        only = mx.arange(logits.shape[-1]) == forced
        return mx.where(only, logits, mx.array(-mx.inf, dtype=logits.dtype))

    return limit


def _logit_bias(bias: tuple[tuple[int, float], ...]) -> LogitsProcessor:
    token_ids = mx.array([t for t, _ in bias], dtype=mx.int32)
    values = mx.array([b for _, b in bias], dtype=mx.float32)

    def add_bias(context: mx.array, logits: mx.array) -> mx.array:
        return logits.at[:, token_ids].add(values.astype(logits.dtype))

    return add_bias


def _min_tokens(min_tokens: int, stop_ids: tuple[int, ...]) -> LogitsProcessor:
    banned = mx.array(stop_ids, dtype=mx.int32)
    num_generated = 0

    def ban_stops(context: mx.array, logits: mx.array) -> mx.array:
        nonlocal num_generated
        if num_generated < min_tokens:
            logits[:, banned] = -float("inf")
        num_generated += 1
        return logits

    return ban_stops


def _output_penalties(presence: float, frequency: float, generated: tuple[int, ...] = ()) -> LogitsProcessor:
    """OpenAI's penalties over the generated tokens only (the prompt is not penalised)."""
    counts: mx.array | None = None

    def penalise(context: mx.array, logits: mx.array) -> mx.array:
        nonlocal counts
        if counts is None:  # first call: only what was generated before a preemption
            counts = mx.zeros((logits.shape[-1],), dtype=mx.float32)
            if generated:
                counts = counts.at[mx.array(generated, dtype=mx.int32)].add(1.0)
        else:
            counts = counts.at[context[-1:]].add(1.0)
        penalty = presence * (counts > 0) + frequency * counts
        return logits - penalty.astype(logits.dtype)

    return penalise


def token_logprobs(rows: Sequence[mx.array], token_ids: Sequence[int], num_tops: Sequence[int]) -> list[TokenLogprob]:
    """Each row's sampled token's logprob and its ``num_tops[i]`` most likely (id, logprob) pairs.

    Every row's ops are built first and evaluated and read back once for them all: a row at a
    time paid a round trip to MLX's compute thread per token (several per step once plans run
    ahead). Each row's top-k is its own (argpartition on that row alone, as a row at a time
    did), so ties break the same whatever else is read with it. No rows are stacked: the copy
    made a 32-row top-5 read on a 151,936-token vocabulary slower than a row at a time."""
    if not rows:
        return []
    picked = [row.reshape(-1)[t : t + 1].astype(mx.float32) for row, t in zip(rows, token_ids, strict=True)]
    chosen = mx.concatenate(picked)
    tops = [_top_logprobs(row, k) for row, k in zip(rows, num_tops, strict=True) if k > 0]
    top_ids = mx.concatenate([ids for ids, _ in tops]) if tops else None
    top_values = mx.concatenate([values for _, values in tops]) if tops else None
    mx.eval(*(a for a in (chosen, top_ids, top_values) if a is not None))
    ids_read = iter(top_ids.tolist() if top_ids is not None else ())
    values_read = iter(top_values.tolist() if top_values is not None else ())
    return [
        TokenLogprob(token_id=token, logprob=value, top=tuple((next(ids_read), next(values_read)) for _ in range(k)))
        for token, value, k in zip(token_ids, chosen.tolist(), _top_counts(rows, num_tops), strict=True)
    ]


def _top_logprobs(row: mx.array, num_top: int) -> tuple[mx.array, mx.array]:
    """The row's ``num_top`` most likely ids and their logprobs, most likely first (lazy)."""
    flat = row.reshape(-1).astype(mx.float32)
    k = min(num_top, flat.shape[0])
    top_ids = mx.argpartition(-flat, kth=k - 1)[:k]
    top_values = flat[top_ids]
    order = mx.argsort(-top_values)
    return top_ids[order], top_values[order]


def _top_counts(rows: Sequence[mx.array], num_tops: Sequence[int]) -> list[int]:
    """How many top pairs each row gets (a vocabulary smaller than the count caps it)."""
    return [min(k, row.size) if k > 0 else 0 for row, k in zip(rows, num_tops, strict=True)]


def guard_processors(
    processors: list[LogitsProcessor], request_id: str, failures: dict[str, str]
) -> list[LogitsProcessor]:
    """Processors that record a failure under ``request_id`` instead of raising, so one
    request's bad processor ends that request only; after a failure they pass logits through
    until the runner removes the request."""

    def wrap(processor: LogitsProcessor) -> LogitsProcessor:
        def call(context: mx.array, logits: mx.array) -> mx.array:
            if request_id in failures:
                return logits
            try:
                return processor(context, logits)
            except Exception as exc:  # boundary: translated into this request's failure
                failures[request_id] = f"{type(exc).__name__}: {exc}"
                return logits

        return call

    return [wrap(processor) for processor in processors]
