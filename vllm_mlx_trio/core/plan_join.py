"""Plans queued back to back that the executor runs as one step. Pure: no Trio, no MLX.

The scheduler keeps a plan queued behind the running one, so the MLX thread never waits for the event loop between
steps. A request that arrives meanwhile is looked up at once and sent in a join plan (``join_previous``); when that
plan is still queued behind another that has not started, the executor takes both and runs one step: every plan's
block work and drops in order, every new sequence, then one advance. So the newcomer starts a step earlier, and the
join plan costs no step of its own. Each plan still gets a result, in order: an empty one for each but the last, and
the step's for the last (:func:`placeholder_result`). Regular plans are never joined: each is one step.
"""

from __future__ import annotations

from collections.abc import Sequence

from .plan import StepPlan, StepResult


def can_join(plans: Sequence[StepPlan], following: StepPlan) -> bool:
    """Whether ``following`` can run in the same step as ``plans`` (which run as one already).

    Only a join plan joins: a regular plan is a step of its own. Not when a disk clear is among them (its order
    against spills matters), nor when ``following`` drops a sequence one of ``plans`` starts (one step starts every
    new sequence after every drop).
    """
    if not following.join_previous or following.clear_disk or any(plan.clear_disk for plan in plans):
        return False
    starting = {seq.request_id for plan in plans for seq in plan.new_seqs}
    return starting.isdisjoint(following.finished_ids)


def joined(plans: Sequence[StepPlan]) -> StepPlan:
    """One step for ``plans`` (in plan order), under the last one's id."""
    if len(plans) == 1:
        return plans[0]
    new_seqs = tuple(seq for plan in plans for seq in plan.new_seqs)
    starting = {seq.request_id for seq in new_seqs}
    decode_ids = dict.fromkeys(rid for plan in plans for rid in plan.decode_ids if rid not in starting)
    return StepPlan(
        step_id=plans[-1].step_id,
        new_seqs=new_seqs,
        decode_ids=tuple(decode_ids),
        finished_ids=tuple(rid for plan in plans for rid in plan.finished_ids),
        store_blocks=tuple(store for plan in plans for store in plan.store_blocks),
        released_ready_ids=tuple(rid for plan in plans for rid in plan.released_ready_ids),
        drop_blocks=tuple(block for plan in plans for block in plan.drop_blocks),
        spill_blocks=tuple(spill for plan in plans for spill in plan.spill_blocks),
    )


def placeholder_result(plan: StepPlan, step: StepResult) -> StepResult:
    """The result of a plan that ran inside a later plan's ``step``: nothing of its own."""
    return StepResult(step_id=plan.step_id, memory=step.memory, ran_in_next=True)


def is_placeholder(result: StepResult) -> bool:
    """Whether ``result`` is a :func:`placeholder_result` (no step of its own: not a step in the metrics)."""
    return result.ran_in_next
