"""When a request's generation ends: one rule, used by the scheduler's ``Request`` and by
every runner (which must agree on it to hand over the finished sequence's KV). Pure.

A step may produce k >= 1 tokens for a sequence (speculative decoding gives several). The
rule reads them in order and stops at the first that ends the request; the tokens after it
are dropped, with their logprobs. Stop *strings* live on the consumer side (they need the
text): :func:`stop_strings_from` says from which token on they count, by the same
``min_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .params import SamplingParams

#: Finish reasons, as OpenAI names them.
STOP = "stop"
LENGTH = "length"


@attrs.frozen(slots=True, kw_only=True)
class Termination:
    """EOS / stop token ids / ``max_tokens`` / ``min_tokens`` for one request.

    ``stop_ids`` end the request only once it has more than ``min_tokens`` output tokens;
    ``max_tokens`` ends it whatever the token.
    """

    stop_ids: frozenset[int]
    min_tokens: int
    max_tokens: int

    @classmethod
    def of(cls, params: SamplingParams, eos_token_ids: tuple[int, ...]) -> Termination:
        assert params.max_tokens is not None, "admission resolves max_tokens"
        return cls(
            stop_ids=frozenset(params.stop_ids(eos_token_ids)),
            min_tokens=params.min_tokens,
            max_tokens=params.max_tokens,
        )

    def scan(self, num_before: int, token_ids: Sequence[int]) -> tuple[int, str | None]:
        """Read new tokens after ``num_before`` output tokens: (how many to keep, finish
        reason or None). Every token is kept unless one ends the request: then it is the
        last one kept (a stop token is delivered, like EOS, so token counts match)."""
        for index, token_id in enumerate(token_ids):
            num_output = num_before + index + 1
            if token_id in self.stop_ids and num_output > self.min_tokens:
                return index + 1, STOP
            if num_output >= self.max_tokens:
                return index + 1, LENGTH
        return len(token_ids), None


def stop_strings_from(min_tokens: int, num_before: int, num_new: int) -> int:
    """Index into ``num_new`` new tokens (after ``num_before``) of the first whose text is
    searched for stop strings: as in vLLM, only output past ``min_tokens`` tokens counts."""
    return min(num_new, max(0, min_tokens - num_before))
