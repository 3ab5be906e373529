"""Jobs on the executor (``EmbedJob``): queued beside the plans, the ones queued back to back run
together through the runner's ``run_jobs``, each answered on its own reply channel."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.actors.executor import ExecutorActor, _Inbox
from vllm_mlx_trio.errors import EngineClosedError, InvalidRequestError
from vllm_mlx_trio.messages import EmbedJob, EmbedReply, NewSequence, RequestId, StepPlan
from vllm_mlx_trio.testing.fake_runner import FakeRunner
from vllm_mlx_trio.testing.harness import open_fake_engine

TIMEOUT_S = 10


class JobRunner(FakeRunner):
    """Blocks its first step; each job's vector is its rows' token sums; records each batch."""

    def __init__(self, **kwargs):
        super().__init__(block_at_step=0, **kwargs)
        self.batches: list[int] = []

    def run_jobs(self, jobs: list[EmbedJob]) -> list[EmbedReply]:
        self.batches.append(len(jobs))
        return [EmbedReply(vectors=tuple((float(sum(row)),) for row in job.inputs)) for job in jobs]


def job(rows, reply) -> EmbedJob:
    return EmbedJob(inputs=tuple(tuple(r) for r in rows), dimensions=None, reply=reply)


def test_jobs_queued_back_to_back_come_out_together_and_a_plan_waits_its_turn():
    inbox = _Inbox()
    first, second = (trio.open_memory_channel(1)[0] for _ in range(2))
    inbox.put_job(job([[1]], first))
    inbox.put_job(job([[2]], second))
    inbox.put(StepPlan(step_id=0))
    assert [j.reply for j in inbox.next_work()] == [first, second]
    assert [p.step_id for p in inbox.next_work()] == [0]
    inbox.put_job(job([[3]], first))
    inbox.stop()
    assert len(inbox.leftover_jobs()) == 1  # the Trio side closes what the thread never took


async def _run_jobs_while_blocked(runner: FakeRunner, rows_per_job: list[list[list[int]]]) -> list[EmbedReply]:
    """Block the runner in a step, queue one job per entry, release: the replies in order."""
    plan_send, plan_recv = trio.open_memory_channel(0)
    result_send, result_recv = trio.open_memory_channel(4)
    actor = ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=lambda _waiting: runner)
    replies = []
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            with plan_send, result_recv:
                seq = NewSequence(
                    request_id=RequestId("a"), prompt_token_ids=(10,), params=SamplingParams(max_tokens=2)
                )
                await plan_send.send(StepPlan(step_id=0, new_seqs=(seq,)))
                await trio.to_thread.run_sync(runner.blocked.wait, abandon_on_cancel=True)
                channels = [trio.open_memory_channel[EmbedReply](1) for _ in rows_per_job]
                for rows, (send, _) in zip(rows_per_job, channels, strict=True):
                    await plan_send.send(job(rows, send))
                runner.release.set()
                for _, recv in channels:
                    with recv:
                        replies.append(await recv.receive())
                        with pytest.raises(trio.EndOfChannel):  # answered once, then closed
                            await recv.receive()
                await result_recv.receive()
    return replies


async def test_jobs_queued_during_a_step_run_as_one_batch_each_answered():
    runner = JobRunner()
    replies = await _run_jobs_while_blocked(runner, [[[1, 2]], [[3], [4, 5]], [[6]]])
    assert runner.batches == [3]
    assert [r.vectors for r in replies] == [((3.0,),), ((3.0,), (9.0,)), ((6.0,),)]


async def test_a_runner_that_does_not_embed_answers_each_job_with_a_400():
    replies = await _run_jobs_while_blocked(FakeRunner(block_at_step=0), [[[1]], [[2]]])
    assert all(isinstance(r.error, InvalidRequestError) for r in replies)
    assert "does not support the Embeddings API" in str(replies[0].error)


async def test_embed_on_an_executor_that_drops_jobs_raises_engine_closed(autojump_clock):
    with trio.fail_after(TIMEOUT_S):
        async with open_fake_engine() as fake:
            with pytest.raises(EngineClosedError):
                await fake.engine.embed([[1, 2]])
            assert fake.engine.num_requests == 0  # its slot is back
