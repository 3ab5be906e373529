"""Plans queued back to back run as one step (core/plan_join.py): the executor's inbox, the
executor's results, and a request that arrives mid-step starting in the plan queued behind it."""

from __future__ import annotations

import attrs
import trio

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.actors.executor import ExecutorActor, _Inbox
from vllm_mlx_trio.engine import open_engine
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.testing.fake_executor import letters_script
from vllm_mlx_trio.testing.fake_runner import BlockingRunner, FakeRunner
from vllm_mlx_trio.testing.polling import wait_until

A, B = RequestId("a"), RequestId("b")
TIMEOUT_S = 10


def new_seq(rid: RequestId, prompt=(10, 11)) -> NewSequence:
    return NewSequence(request_id=rid, prompt_token_ids=prompt, params=SamplingParams(max_tokens=50))


def test_a_join_plan_queued_behind_a_plan_comes_out_with_it():
    inbox = _Inbox()
    inbox.put(StepPlan(step_id=0, decode_ids=(A,)))
    inbox.put(StepPlan(step_id=1, new_seqs=(new_seq(B),), join_previous=True))
    assert inbox.starts_waiting()
    assert [p.step_id for p in inbox.next_work()] == [0, 1]
    assert not inbox.starts_waiting()


def test_regular_plans_queued_together_stay_steps_of_their_own():
    inbox = _Inbox()
    inbox.put(StepPlan(step_id=0, new_seqs=(new_seq(A),)))
    inbox.put(StepPlan(step_id=1, decode_ids=(A,)))
    assert [p.step_id for p in inbox.next_work()] == [0]
    assert [p.step_id for p in inbox.next_work()] == [1]


def test_a_plan_that_cannot_join_is_the_next_step_and_still_counts_as_waiting():
    inbox = _Inbox()
    inbox.put(StepPlan(step_id=0, new_seqs=(new_seq(A),)))
    inbox.put(StepPlan(step_id=1, finished_ids=(A,), new_seqs=(new_seq(B),), join_previous=True))  # drops A
    assert [p.step_id for p in inbox.next_work()] == [0]
    assert inbox.starts_waiting()  # held for the next step, not yet taken
    assert [p.step_id for p in inbox.next_work()] == [1]
    assert not inbox.starts_waiting()


def test_the_stop_marker_ends_after_the_plans_before_it():
    inbox = _Inbox()
    inbox.put(StepPlan(step_id=0, decode_ids=(A,)))
    inbox.stop()
    inbox.put(StepPlan(step_id=1, decode_ids=(A,)))  # never taken
    assert [p.step_id for p in inbox.next_work()] == [0]
    assert inbox.next_work() is None


async def test_the_executor_answers_each_plan_of_a_joined_step_in_order():
    runner = FakeRunner(block_at_step=0)
    plan_send, plan_recv = trio.open_memory_channel[StepPlan](0)
    result_send, result_recv = trio.open_memory_channel(3)
    actor = ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=lambda _waiting: runner)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            with plan_send, result_recv:
                await plan_send.send(StepPlan(step_id=0, new_seqs=(new_seq(A),)))
                await trio.to_thread.run_sync(runner.blocked.wait, abandon_on_cancel=True)
                await plan_send.send(StepPlan(step_id=1, decode_ids=(A,)))
                await plan_send.send(StepPlan(step_id=2, new_seqs=(new_seq(B),), decode_ids=(A,), join_previous=True))
                runner.release.set()
                results = [await result_recv.receive() for _ in range(3)]
    assert [r.step_id for r in results] == [0, 1, 2]
    assert results[1].sampled == ()  # plan 1 ran inside plan 2's step
    assert dict(results[2].sampled) == {A: (letters_script(new_seq(A), 1),), B: (letters_script(new_seq(B), 0),)}
    assert [p.step_id for p in runner.plans] == [0, 2]


async def _two_requests(cfg, runners, first_prompt: str, *, before_release) -> tuple[FakeRunner, dict[str, list[int]]]:
    """``first_prompt``'s first step blocks; a second request ("h") arrives meanwhile; the step
    goes on once ``before_release(engine)`` returns. The runner (its plans) and the outputs."""
    outputs: dict[str, list[int]] = {}

    async def run(engine, name: str, prompt: str) -> None:
        with await engine.submit(prompt, SamplingParams(max_tokens=3)) as stream:
            outputs[name] = [t async for d in stream for t in d.token_ids]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg, runners=runners) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(run, engine, "first", first_prompt)
            [runner] = BlockingRunner.instances
            await trio.to_thread.run_sync(runner.blocked.wait, abandon_on_cancel=True)
            # The first request's step runs; the plan behind it (its decode) is queued.
            nursery.start_soon(run, engine, "second", "h")
            await before_release(engine)
            runner.release.set()
    return runner, outputs


async def test_a_request_arriving_mid_step_starts_in_the_plan_queued_behind_it(fake_cfg, blocking_kind):
    mode, runners = blocking_kind
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode=mode))

    async def joined(engine):
        await wait_until(lambda: engine.statistics().scheduler.plans_in_flight == 3, poll_s=0.005)

    # one prompt token: nothing to compute
    runner, outputs = await _two_requests(cfg, runners, "h", before_release=joined)
    second_step = runner.plans[1]
    assert second_step.step_id == 2 and len(second_step.new_seqs) == 1  # the newcomer starts in the second step
    assert len(second_step.decode_ids) == 1
    assert outputs["first"] == outputs["second"] and len(outputs["second"]) == 3


async def test_while_a_prompt_is_computed_arrivals_wait_for_its_result(fake_cfg, blocking_kind):
    mode, runners = blocking_kind
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode=mode))

    async def queued(engine):
        await wait_until(lambda: engine.statistics().scheduler.num_waiting == 1, poll_s=0.005)

    runner, outputs = await _two_requests(cfg, runners, "hello", before_release=queued)  # a prompt to compute: its
    # blocks may serve the newcomer once it is done
    assert [p.step_id for p in runner.plans[:2]] == [0, 1] and runner.plans[1].new_seqs == ()
    assert len(runner.plans[2].new_seqs) == 1
    assert len(outputs["second"]) == 3
