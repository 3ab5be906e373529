"""Run-ahead in batched mode: several decode steps in one plan.

While every row decodes (no prompt in the generator or the runner's prefill but one taking timed
chunks), a plan runs more decode steps back to back ("run-ahead"), up to ``engine.run_ahead_steps``
(24) and while the plan has taken less than ``engine.run_ahead_ms`` (16 ms; with one row in the batch
``engine.solo_run_ahead_steps`` and ``_ms``, 16 and 32 ms: a lone stream delays no other, and an
arrival still ends the plan; beside a timed prompt chunk ``engine.chunk_run_ahead_ms``), and within
the KV budget with the scheduler's headroom for one token a
plan left whole (:func:`kv_fits`: its accounting, which catches up as results arrive, holds as
with one step a plan): where a step is short (a small model), the MLX thread goes from step to step
without waiting for the scheduler's next plan, and the scheduler builds one plan for several steps;
a long step runs alone as before. Each step's tokens still leave as the step ends
(``RunnerBase._publish``: a result with ``plan_continues``), unless ``engine.hold_run_ahead_tokens``
keeps them for the plan's own result (:func:`joined`): one streamed chunk for the plan.
A row that ends stops it, and so does a request waiting to
start (a queued plan starts it, or the scheduler said one was admitted: the executor tells). A step
that gives a row its first token ends the plan, so the token leaves at once (time to first token).
Not when sharded: every rank must run the same steps. The loop itself is ``BatchRunner._advance``
(worker/batched/runner.py); ``BatchRunner._run_ahead_bounds`` picks the bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.shared_prefix import kv_tokens
from ..runner_base import Advance, Emission, LiveSequence


def joined(first: Advance, then: Advance) -> Advance:
    """Two decode steps of the same rows as one advance: each row's tokens (and logprob rows)
    in order; ``ended`` and ``final`` are the later step's."""
    later = {e.request_id: e for e in then.emissions}
    emissions = [
        Emission(e.request_id, e.tokens + n.tokens, e.rows + n.rows, ended=n.ended, final=n.final)
        if (n := later.pop(e.request_id, None)) is not None
        else e
        for e in first.emissions
    ]
    return Advance([*emissions, *later.values()], [*first.prompts_done, *then.prompts_done])


def kv_fits(
    live: Sequence[LiveSequence], steps: int, budget: int | None, headroom: int, shared: Sequence[int] | None = None
) -> bool:
    """``live`` grown by ``steps`` tokens each, plus ``headroom`` tokens each (the scheduler's: a
    token for each plan in flight and the next), fits the KV ``budget`` (rows x longest row; with
    ``shared``, each row's tokens of a prefix held once, that prefix once plus rows x longest suffix)."""
    if budget is None or not live:
        return True
    lengths = [len(s.seq.prompt_token_ids) + len(s.emitted) for s in live]
    return kv_tokens(lengths, shared or [0] * len(lengths), steps + headroom) <= budget
