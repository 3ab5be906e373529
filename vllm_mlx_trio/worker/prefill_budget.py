"""How many prompt tokens a plan prefills beside decoding rows: a time budget, not a token one.

A plan that carries a prompt chunk delays every decoding row's next tokens by the chunk's
cost. :class:`ChunkSizer` measures the runner's plan period (start of one plan to the start of
the next, which is what a stream sees between two streamed pieces) with and without a chunk,
keeps a running estimate of one decode step and of the extra cost per prompt token, and sizes
the next chunk so it costs about ``ratio`` times the plan's decode steps: a plan with a chunk
then costs ``1 + ratio`` times one without, for the same tokens, so a stream's pace per token
drops by that factor and no more. A plan runs several decode steps when the runner runs ahead
(``max_steps`` > 1, as many as fit ``plan_s``); one chunk per plan then pays a forward pass's
fixed cost once for all of them, so the prompt is prefilled in larger, cheaper-per-token chunks.
The cost per token grows with the prompt's offset (attention reads the whole cache) and with
the machine's load; the estimate follows both. Imports no MLX: the arithmetic is tested alone.
"""

from __future__ import annotations

import attrs

#: Weight of a new period in the running estimates: about the last 4 plans count.
SMOOTHING = 0.25
#: Chunk before any chunk has been timed: small enough not to stall the streams much, large
#: enough that the first measurement is above the timer's noise.
FIRST_CHUNK_TOKENS = 16
#: The smallest chunk: a chunk pays a second forward pass, whose fixed cost does not shrink
#: with the chunk (demo:tiny on this CPU, CPU time per step: decode alone 2.1 ms, with a chunk
#: of 1, 2 or 4 tokens 4.0-4.3 ms, of 8 5.1 ms): below this, prefill slows with no gain in ITL.
MIN_CHUNK_TOKENS = 4
#: A period over this many times what the estimates expect for it is a pause (the loop waited
#: for a plan, the machine was busy elsewhere), not a cost of the chunk: it is clipped to this.
MAX_PERIOD_RATIO = 3.0


@attrs.define(slots=True)
class ChunkSizer:
    """Prompt tokens for the next plan while rows decode, from measured plan periods."""

    #: A chunk should cost about ``ratio`` times the plan's decode steps.
    ratio: float
    #: Never more than this many tokens in one chunk (engine.prefill_step_size_decoding).
    max_tokens: int
    min_tokens: int = MIN_CHUNK_TOKENS
    #: False: always ``max_tokens`` (ranks of a sharded model must all pick the same chunk,
    #: and their clocks differ).
    timed: bool = True
    #: Decode steps a plan may run (engine.run_ahead_steps; 1 when it does not run ahead) and
    #: the seconds they may take together (the runner's run-ahead bound).
    max_steps: int = 1
    plan_s: float = 0.0
    decode_s: float | None = None
    token_s: float | None = None

    def observe(self, period_s: float, chunk_tokens: int, steps: int = 1) -> None:
        """One plan's period while rows decode: its decode steps and the prompt tokens it prefilled."""
        if not self.timed or steps < 1:
            return
        if chunk_tokens <= 0:
            per_step = period_s / steps
            expected = per_step if self.decode_s is None else self.decode_s
            self.decode_s = _smooth(self.decode_s, min(per_step, MAX_PERIOD_RATIO * expected))
            return
        if self.decode_s is None:
            return  # the chunk's share of the period is not known yet
        decode = steps * self.decode_s
        if self.token_s is not None:
            period_s = min(period_s, MAX_PERIOD_RATIO * (decode + self.token_s * chunk_tokens))
        self.token_s = _smooth(self.token_s, max(period_s - decode, 0.0) / chunk_tokens)

    def steps(self) -> int:
        """Decode steps the next plan is expected to run: as many as fit ``plan_s``, at most ``max_steps``."""
        if self.decode_s is None or self.max_steps <= 1 or self.decode_s <= 0:
            return 1
        return max(1, min(self.max_steps, int(self.plan_s / self.decode_s)))

    def chunk(self) -> int:
        """Tokens for the next plan's chunk."""
        if not self.timed:
            return self.max_tokens
        if self.decode_s is None or self.token_s is None:
            return max(self.min_tokens, min(self.max_tokens, FIRST_CHUNK_TOKENS))
        if self.token_s <= 0:
            return self.max_tokens
        tokens = int(self.ratio * self.steps() * self.decode_s / self.token_s)
        return max(self.min_tokens, min(self.max_tokens, tokens))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
