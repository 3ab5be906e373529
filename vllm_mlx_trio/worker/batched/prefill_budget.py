"""How many prompt tokens a plan prefills beside decoding rows: a time budget, not a token one.

A plan that carries a prompt chunk delays every decoding row's next tokens by the chunk's
cost. :class:`ChunkSizer` keeps two running estimates: a plan's decode time (start of one plan
to the start of the next, less its chunk: what the streams' tokens of that plan cost, however
many decode steps it runs ahead) and a chunk's cost per prompt token (the runner times each
chunk alone, after the work queued before it). It sizes the next chunk to cost about ``ratio``
times a plan's decode time, so a plan with a chunk costs ``1 + ratio`` times its tokens alone:
a stream's pace per token drops by that factor and no more. A plan that runs several decode
steps takes one chunk for all of them, so a forward pass's fixed cost is paid once per plan
and the chunks are larger and cheaper per token. The cost per token grows with
the prompt's offset (attention reads the whole cache), the fixed cost weighs more on a small
chunk, and the machine's load changes both; the estimate follows them. Imports no MLX: the
arithmetic is tested alone.
"""

from __future__ import annotations

import attrs

#: Weight of a new measurement in the running estimates: about the last 4 count.
SMOOTHING = 0.25
#: Chunk before any chunk has been timed: small enough not to stall the streams much, large
#: enough that the first measurement is above the timer's noise.
FIRST_CHUNK_TOKENS = 16
#: The smallest chunk: a chunk pays a second forward pass, whose fixed cost does not shrink
#: with the chunk (demo:tiny on this CPU, CPU time per step: decode alone 2.1 ms, with a chunk
#: of 1, 2 or 4 tokens 4.0-4.3 ms, of 8 5.1 ms): below this, prefill slows with no gain in ITL.
MIN_CHUNK_TOKENS = 4
#: A measurement over this many times the running estimate is a pause (the loop waited for a
#: plan, the machine was busy elsewhere), not a cost of the plan or the chunk: it is clipped.
MAX_PERIOD_RATIO = 3.0


@attrs.define(slots=True)
class ChunkSizer:
    """Prompt tokens for the next plan's chunk while rows decode, from measured times."""

    #: A chunk should cost about ``ratio`` times a plan's decode time.
    ratio: float
    #: Never more than this many tokens in one chunk (engine.prefill_step_size_decoding).
    max_tokens: int
    min_tokens: int = MIN_CHUNK_TOKENS
    #: False: always ``max_tokens`` (ranks of a sharded model must all pick the same chunk,
    #: and their clocks differ).
    timed: bool = True
    plan_s: float | None = None
    token_s: float | None = None

    def observe_plan(self, period_s: float) -> None:
        """A plan's decode time (its period less its timed chunk), rows decoding through it."""
        if not self.timed:
            return
        expected = period_s if self.plan_s is None else self.plan_s
        self.plan_s = _smooth(self.plan_s, min(period_s, MAX_PERIOD_RATIO * expected))

    def observe_chunk(self, seconds: float, tokens: int) -> None:
        """A chunk of ``tokens`` prompt tokens took ``seconds`` (its forward pass alone)."""
        if not self.timed or tokens <= 0:
            return
        per_token = seconds / tokens
        if self.token_s is not None:
            per_token = min(per_token, MAX_PERIOD_RATIO * self.token_s)
        self.token_s = _smooth(self.token_s, per_token)

    def chunk(self) -> int:
        """Tokens for the next plan's chunk."""
        if not self.timed:
            return self.max_tokens
        if self.plan_s is None or self.token_s is None:
            return max(self.min_tokens, min(self.max_tokens, FIRST_CHUNK_TOKENS))
        if self.token_s <= 0:
            return self.max_tokens
        tokens = int(self.ratio * self.plan_s / self.token_s)
        return max(self.min_tokens, min(self.max_tokens, tokens))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
