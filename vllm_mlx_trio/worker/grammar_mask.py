"""Grammar-constrained decoding on the MLX thread: one llguidance matcher per constrained row.

The matcher computes which tokens may come next (a bitmask, one bit per token, ~26 µs); the
mask is applied in MLX on whatever device runs the model (llguidance's own ``llguidance.mlx``
helper is a Metal kernel and fails on the CPU backend): the words are unpacked with a shift
and an and, and disallowed logits become -inf. Once the grammar may end, the request's stop
ids are allowed too; once it must end, only they and EOS are (EOS goes on being allowed
under ``ignore_eos``, until ``max_tokens``).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from ..core.constraint import CompiledGrammar

LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


class GrammarViolation(RuntimeError):
    """A sampled token the grammar did not allow (a bug, or a processor after the mask lifting it)."""


@mx.compile
def _masked(logits: mx.array, words: mx.array) -> mx.array:
    """``logits`` (1, V) with every token whose bit in ``words`` (uint32, ceil(V/32)) is 0 set to -inf."""
    bits = (words[:, None] >> mx.arange(32, dtype=mx.uint32)) & 1  # made here: arrays belong to a thread's stream
    allowed = bits.reshape(-1)[: logits.shape[-1]].astype(mx.bool_)
    return mx.where(allowed, logits, mx.array(-mx.inf, dtype=logits.dtype))


def apply_bitmask(logits: mx.array, words: np.ndarray) -> mx.array:
    """Mask ``logits`` with a token bitmask (llguidance's layout: bit ``t % 32`` of word ``t // 32``)."""
    needed = (logits.shape[-1] + 31) // 32
    if words.shape[0] < needed:  # the model's vocabulary is padded past the tokenizer's
        words = np.concatenate([words, np.zeros(needed - words.shape[0], dtype=words.dtype)])
    return _masked(logits, mx.array(words[:needed].view(np.uint32)))


def grammar_processor(
    grammar: CompiledGrammar, *, stop_ids: tuple[int, ...], generated: tuple[int, ...] = ()
) -> LogitsProcessor:
    """The logits processor enforcing ``grammar`` on one row.

    Called once per generated token (see sampling.py): the first call sees the prompt only,
    each later one advances the matcher by the token sampled last (``context[-1]``). A resumed
    row's ``generated`` tokens are replayed into the fresh matcher first.
    """
    matcher = grammar.new_matcher()
    stop_array = np.asarray(stop_ids, dtype=np.int64)
    calls = 0

    def constrain(context: mx.array, logits: mx.array) -> mx.array:
        nonlocal calls
        if calls == 0 and generated and not matcher.consume_tokens(list(generated)):
            raise GrammarViolation(f"resumed tokens do not match the grammar: {matcher.get_error()}")
        if calls > 0:
            token = int(context[-1].item())
            if not matcher.consume_token(token):
                raise GrammarViolation(f"token {token} is outside the grammar: {matcher.get_error()}")
        calls += 1
        if matcher.is_stopped():  # only EOS / stop ids remain: they win over min_tokens' ban
            logits = mx.zeros_like(logits)
        return apply_bitmask(logits, _allowed_words(matcher, stop_array))

    return constrain


def _allowed_words(matcher, stop_ids: np.ndarray) -> np.ndarray:
    """The matcher's mask (only EOS once the grammar must end), with the request's stop ids
    wherever the grammar may end."""
    words = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint32).copy()
    if stop_ids.size and matcher.is_accepting():
        needed = (int(stop_ids.max()) >> 5) + 1
        if words.shape[0] < needed:
            words = np.concatenate([words, np.zeros(needed - words.shape[0], dtype=np.uint32)])
        np.bitwise_or.at(words, stop_ids >> 5, np.uint32(1) << (stop_ids & 31).astype(np.uint32))
    return words
