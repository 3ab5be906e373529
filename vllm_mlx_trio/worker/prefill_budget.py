"""How many prompt tokens a step prefills beside decoding rows: a time budget, not a token one.

A step that carries a prompt chunk delays every decoding row's next token by the chunk's
cost. :class:`ChunkSizer` measures the runner's step period (start of one step to the start
of the next, which is what a stream sees as its inter-token latency) with and without a chunk,
keeps a running estimate of the decode-only period and of the extra cost per prompt token,
and sizes the next chunk so a step with it costs about ``1 + ratio`` decode-only steps.
The cost per token grows with the prompt's offset (attention reads the whole cache) and with
the machine's load; the estimate follows both. Imports no MLX: the arithmetic is tested alone.
"""

from __future__ import annotations

import attrs

#: Weight of a new period in the running estimates: about the last 4 steps count.
SMOOTHING = 0.25
#: Chunk before any chunk has been timed: small enough not to stall the streams much, large
#: enough that the first measurement is above the timer's noise.
FIRST_CHUNK_TOKENS = 16
#: The smallest chunk: a chunk step pays a second forward pass, whose fixed cost does not shrink
#: with the chunk (demo:tiny on this CPU, CPU time per step: decode alone 2.1 ms, with a chunk
#: of 1, 2 or 4 tokens 4.0-4.3 ms, of 8 5.1 ms): below this, prefill slows with no gain in ITL.
MIN_CHUNK_TOKENS = 4
#: A period over this many times what the estimates expect for it is a pause (the loop waited
#: for a plan, the machine was busy elsewhere), not a cost of the chunk: it is clipped to this.
MAX_PERIOD_RATIO = 3.0


@attrs.define(slots=True)
class ChunkSizer:
    """Prompt tokens for the next step while rows decode, from measured step periods."""

    #: A chunk step should cost about (1 + ratio) decode-only steps.
    ratio: float
    #: Never more than this many tokens in one chunk (engine.prefill_step_size_decoding).
    max_tokens: int
    min_tokens: int = MIN_CHUNK_TOKENS
    #: False: always ``max_tokens`` (ranks of a sharded model must all pick the same chunk,
    #: and their clocks differ).
    timed: bool = True
    decode_s: float | None = None
    token_s: float | None = None

    def observe(self, period_s: float, chunk_tokens: int) -> None:
        """One step's period while rows decode, and the prompt tokens it prefilled."""
        if not self.timed:
            return
        if chunk_tokens <= 0:
            expected = period_s if self.decode_s is None else self.decode_s
            self.decode_s = _smooth(self.decode_s, min(period_s, MAX_PERIOD_RATIO * expected))
            return
        if self.decode_s is None:
            return  # the chunk's share of the period is not known yet
        if self.token_s is not None:
            period_s = min(period_s, MAX_PERIOD_RATIO * (self.decode_s + self.token_s * chunk_tokens))
        self.token_s = _smooth(self.token_s, max(period_s - self.decode_s, 0.0) / chunk_tokens)

    def chunk(self) -> int:
        """Tokens for the next chunk step."""
        if not self.timed:
            return self.max_tokens
        if self.decode_s is None or self.token_s is None:
            return max(self.min_tokens, min(self.max_tokens, FIRST_CHUNK_TOKENS))
        if self.token_s <= 0:
            return self.max_tokens
        tokens = int(self.ratio * self.decode_s / self.token_s)
        return max(self.min_tokens, min(self.max_tokens, tokens))


def _smooth(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)
