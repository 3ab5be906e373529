"""core/plan_join.py: which queued plans run as one step, and what that step does."""

from __future__ import annotations

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.plan import BlockStore, NewSequence, RequestId, StepPlan, StepResult
from vllm_mlx_trio.core.plan_join import can_join, is_placeholder, joined, placeholder_result

A, B, C = RequestId("a"), RequestId("b"), RequestId("c")


def seq(rid: RequestId) -> NewSequence:
    return NewSequence(request_id=rid, prompt_token_ids=(1, 2, 3), params=SamplingParams(max_tokens=4))


def test_one_plan_is_its_own_step():
    plan = StepPlan(step_id=3, decode_ids=(A,))
    assert joined([plan]) is plan


def test_a_join_plan_runs_in_the_step_of_the_plan_before_it():
    store = BlockStore(ready_id=0, block_index=0, block_id=9)
    queued = StepPlan(
        step_id=1, decode_ids=(A,), finished_ids=(C,), drop_blocks=(7,), store_blocks=(store,), released_ready_ids=(0,)
    )
    join = StepPlan(
        step_id=2, new_seqs=(seq(B),), decode_ids=(A,), drop_blocks=(8,), spill_blocks=((8, b"h"),), join_previous=True
    )
    assert can_join([queued], join)
    step = joined([queued, join])
    assert step.step_id == 2  # the last plan's id: its result carries the step
    assert [s.request_id for s in step.new_seqs] == [B]
    assert step.decode_ids == (A,) and step.finished_ids == (C,)
    assert step.drop_blocks == (7, 8) and step.spill_blocks == ((8, b"h"),)
    assert step.store_blocks == queued.store_blocks and step.released_ready_ids == (0,)


def test_sequences_started_by_either_plan_do_not_also_decode():
    queued = StepPlan(step_id=1, new_seqs=(seq(A),))
    join = StepPlan(step_id=2, new_seqs=(seq(B),), decode_ids=(A,), join_previous=True)  # A runs by then
    step = joined([queued, join])
    assert [s.request_id for s in step.new_seqs] == [A, B] and step.decode_ids == ()


def test_a_plan_that_drops_a_sequence_an_earlier_one_starts_waits_for_the_next_step():
    queued = StepPlan(step_id=1, new_seqs=(seq(A),))
    assert not can_join([queued], StepPlan(step_id=2, finished_ids=(A,), join_previous=True))
    assert can_join([queued], StepPlan(step_id=2, finished_ids=(B,), join_previous=True))  # another's drop: fine


def test_a_regular_plan_is_a_step_of_its_own():
    assert not can_join([StepPlan(step_id=1, new_seqs=(seq(A),))], StepPlan(step_id=2, decode_ids=(A,)))


def test_a_disk_clear_never_joins():
    plain = StepPlan(step_id=1, decode_ids=(A,))
    clear = StepPlan(step_id=2, clear_disk=True, join_previous=True)
    assert not can_join([plain], clear)
    assert not can_join([clear], StepPlan(step_id=3, new_seqs=(seq(B),), join_previous=True))


def test_a_placeholder_result_says_nothing_and_is_told_apart():
    step = StepResult(step_id=2, sampled=((A, (5,)),), elapsed_s=0.01, memory=(1, 2, 3))
    placeholder = placeholder_result(StepPlan(step_id=1), step)
    assert placeholder.step_id == 1 and placeholder.sampled == () and placeholder.memory == (1, 2, 3)
    assert is_placeholder(placeholder) and not is_placeholder(step)
