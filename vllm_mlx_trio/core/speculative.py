"""Speculative decoding's pure rules: the envelope, the draft budget, and the counts a step reports.

The envelope is where speculation is exact and worth it: on the one-row path (caches whose rows cannot roll back
one by one, MTP's thinking gate) one request running; on the batched path (worker/speculative/batched_rows.py) any
number, each row accepting its own count and rolled back on its own (worker/speculative/ragged.py,
worker/speculative/batch_txn.py), with the number of drafts per round chosen by core/spec_rule.py; and per request:
greedy decoding (the verify forward's argmax *is* the normal path's token) or, with a drafter that supports it,
unseeded sampling through speculative rejection sampling (the output is distributed as the target's own sampling;
worker/speculative/sampling.py), no request-local logits processors (they would have to run once per draft position, in
order, and a constraint's state would have to roll back), and no logprobs (the normal path reports them).
Anything else runs the normal batched path; the runner moves a sequence between the two when the envelope changes
(worker/speculative/runner.py).
"""

from __future__ import annotations

import attrs

from .params import SamplingParams


def sampling_fits(params: SamplingParams, num_output_tokens: int, *, sampled: bool = False) -> bool:
    """Whether this request's own settings allow speculation, ``num_output_tokens`` tokens into its output.

    Greedy (temperature 0, top_p 1, top_k 0, min_p 0) or, with ``sampled`` (the drafter supports speculative
    rejection sampling), sampled with any temperature / top_p / top_k / min_p but no ``seed`` (a seeded request
    draws the same tokens whatever else runs; speculation would make them depend on whether it ran alone). And
    always: no logprobs, no penalties, no logit_bias, no constraint, no thinking budget, and ``min_tokens`` already
    reached (until then its processor bans the stop tokens).
    """
    greedy = params.temperature == 0.0 and params.top_p == 1.0 and params.top_k == 0 and params.min_p == 0.0
    sampled_fits = sampled and not params.is_greedy and params.seed is None
    return (
        (greedy or sampled_fits)
        and params.logprobs is None
        and params.repetition_penalty == 1.0
        and params.presence_penalty == 0.0
        and params.frequency_penalty == 0.0
        and not params.logit_bias
        and params.constraint is None
        and params.thinking_budget is None
        and params.min_tokens <= num_output_tokens
    )


def in_envelope(num_running: int, params: SamplingParams, num_output_tokens: int, *, sampled: bool = False) -> bool:
    """Whether a sequence may take a speculative step: it runs alone and its settings fit."""
    return num_running == 1 and sampling_fits(params, num_output_tokens, sampled=sampled)


def draft_budget(num_draft_tokens: int, tokens_left: int) -> int:
    """Drafts worth proposing when ``tokens_left`` more output tokens may be emitted: a step emits at most
    drafts + 1 tokens, so drafting past ``tokens_left - 1`` is wasted work."""
    return max(0, min(num_draft_tokens, tokens_left - 1))


@attrs.frozen(slots=True, kw_only=True)
class SpecDecodeCounts:
    """What speculation did during some steps, with vLLM's meanings: a *draft* is one verify round of one
    sequence, ``accepted_per_position[i]`` counts rounds whose draft at position ``i`` (from 0) was accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()

    @classmethod
    def of_round(cls, num_proposed: int, num_accepted: int) -> SpecDecodeCounts:
        """One verify round: ``num_proposed`` drafts, the first ``num_accepted`` of them accepted."""
        return cls(
            num_drafts=1,
            num_draft_tokens=num_proposed,
            num_accepted_tokens=num_accepted,
            accepted_per_position=(1,) * num_accepted,
        )

    def __add__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + (0,) * (width - len(self.accepted_per_position))
        theirs = other.accepted_per_position + (0,) * (width - len(other.accepted_per_position))
        return SpecDecodeCounts(
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            accepted_per_position=tuple(a + b for a, b in zip(mine, theirs, strict=True)),
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted over proposed draft tokens; None before any was proposed."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens emitted per verify round (accepted drafts + the bonus token); None before any round."""
        return (self.num_accepted_tokens + self.num_drafts) / self.num_drafts if self.num_drafts else None
