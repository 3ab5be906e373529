"""The runner contract, under the real ExecutorActor and its thread bridge, with FakeRunner.

Real threads: no autojump clock here. Every wait is on a channel or an event, bounded by
``trio.fail_after``; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import threading

import attrs
import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.actors.executor import ExecutorActor, _Inbox
from vllm_mlx_trio.engine import open_engine
from vllm_mlx_trio.errors import EngineStalledError, ExecutorCrashedError
from vllm_mlx_trio.messages import NewSequence, RequestId, RequestWaiting, StepPlan
from vllm_mlx_trio.testing.fake_executor import IM_END, letters_script, text_script
from vllm_mlx_trio.testing.fake_runner import BlockingRunner, FakeRunner
from vllm_mlx_trio.worker.registry import with_runner

A, B = RequestId("a"), RequestId("b")
TIMEOUT_S = 10


def new_seq(rid: RequestId, prompt=(10, 11), **params) -> NewSequence:
    params.setdefault("max_tokens", 50)
    return NewSequence(request_id=rid, prompt_token_ids=prompt, params=SamplingParams(**params))


@contextlib.asynccontextmanager
async def running_executor(runner: FakeRunner):
    """The real ExecutorActor on ``runner``: yields (plan_send, result_recv)."""
    plan_send, plan_recv = trio.open_memory_channel[StepPlan](0)
    result_send, result_recv = trio.open_memory_channel(runner.plans_in_flight)
    actor = ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=lambda _waiting: runner)
    async with trio.open_nursery() as nursery:
        info = await nursery.start(actor.run)
        assert info.model_path == "fake-runner"
        with plan_send, result_recv:
            yield plan_send, result_recv


async def step(plan_send, result_recv, plan: StepPlan):
    await plan_send.send(plan)
    return await result_recv.receive()


def expected(seq: NewSequence, start: int, count: int) -> tuple[int, ...]:
    return tuple(letters_script(seq, i) for i in range(start, start + count))


async def test_insert_step_remove_on_the_executor_thread():
    runner = FakeRunner()
    a, b = new_seq(A), new_seq(B, prompt=(20,))
    with trio.fail_after(TIMEOUT_S):
        async with running_executor(runner) as (plans, results):
            first = await step(plans, results, StepPlan(step_id=0, new_seqs=(a, b)))
            second = await step(plans, results, StepPlan(step_id=1, decode_ids=(A, B)))
            live_before = runner.live_ids
            third = await step(plans, results, StepPlan(step_id=2, decode_ids=(B,), finished_ids=(A,)))
            live_after = runner.live_ids
    assert first.sampled == ((A, expected(a, 0, 1)), (B, expected(b, 0, 1)))
    assert second.sampled == ((A, expected(a, 1, 1)), (B, expected(b, 1, 1)))
    assert third.sampled == ((B, expected(b, 2, 1)),)
    assert (live_before, live_after) == ({A, B}, {B})
    assert len(runner.thread_ids) == 1 and threading.get_ident() not in runner.thread_ids
    assert runner.closed.is_set()


async def test_per_request_failure_drops_that_request_only():
    def fail_b(seq, step_index):
        return "bad processor" if seq.request_id == B and step_index == 1 else None

    runner = FakeRunner(fail_request=fail_b)
    a, b = new_seq(A, logprobs=1), new_seq(B, logprobs=1)
    with trio.fail_after(TIMEOUT_S):
        async with running_executor(runner) as (plans, results):
            await step(plans, results, StepPlan(step_id=0, new_seqs=(a, b)))
            failed_step = await step(plans, results, StepPlan(step_id=1, decode_ids=(A, B)))
            after = await step(plans, results, StepPlan(step_id=2, decode_ids=(A, B)))
    assert failed_step.failed == ((B, "bad processor"),)
    assert [rid for rid, _ in failed_step.sampled] == [A]
    assert [rid for rid, _ in failed_step.logprobs] == [A]
    assert [rid for rid, _ in after.sampled] == [A]  # B is gone from the runner
    assert runner.live_ids == set()  # closed


async def test_step_exception_crashes_the_executor():
    runner = FakeRunner(raise_at_step=1)
    with trio.fail_after(TIMEOUT_S):
        with pytest.RaisesGroup(
            pytest.RaisesExc(ExecutorCrashedError, match="injected failure at step 1"), flatten_subgroups=True
        ):
            async with running_executor(runner) as (plans, results):
                await step(plans, results, StepPlan(step_id=0, new_seqs=(new_seq(A),)))
                await plans.send(StepPlan(step_id=1, decode_ids=(A,)))
                await trio.sleep_forever()  # the crash ends the actor and cancels this
    assert runner.closed.is_set()


async def test_normal_stop_sends_the_stop_marker_and_closes_the_runner():
    runner = FakeRunner()
    with trio.fail_after(TIMEOUT_S):
        async with running_executor(runner) as (plans, results):
            await step(plans, results, StepPlan(step_id=0, new_seqs=(new_seq(A),)))
            plans.close()  # the plan channel closes: the actor sends the stop marker
            with pytest.raises(trio.EndOfChannel):
                await results.receive()  # the actor returned and closed its result end
    assert runner.closed.is_set()
    assert len(runner.thread_ids) == 1  # closed on the thread that loaded and stepped
    assert len(runner.plans) == 1


async def test_cancelling_abandons_a_blocked_step():
    runner = FakeRunner(block_at_step=0)
    with trio.fail_after(TIMEOUT_S):
        with trio.CancelScope() as scope:
            async with running_executor(runner) as (plans, _results):
                await plans.send(StepPlan(step_id=0, new_seqs=(new_seq(A),)))
                await plans.send(StepPlan(step_id=1, decode_ids=(A,)))  # queued behind it
                await trio.to_thread.run_sync(runner.blocked.wait, abandon_on_cancel=True)
                scope.cancel()
        # the actor returned while its thread is still stuck in the step
        assert not runner.closed.is_set()
        runner.release.set()
        await trio.to_thread.run_sync(runner.closed.wait, abandon_on_cancel=True)
    assert len(runner.plans) == 1  # abandoned: the queued plan was never run


async def test_several_tokens_per_step_stop_at_max_tokens_mid_step():
    runner = FakeRunner(tokens_per_step=(3,))
    a = new_seq(A, max_tokens=5, logprobs=0)
    with trio.fail_after(TIMEOUT_S):
        async with running_executor(runner) as (plans, results):
            first = await step(plans, results, StepPlan(step_id=0, new_seqs=(a,)))
            second = await step(plans, results, StepPlan(step_id=1, decode_ids=(A,)))
            live = runner.live_ids
            third = await step(plans, results, StepPlan(step_id=2, decode_ids=(A,)))  # a stale plan
    assert first.sampled == ((A, expected(a, 0, 3)),)
    assert second.sampled == ((A, expected(a, 3, 2)),)  # max_tokens falls mid-step
    assert [len(lp) for _, lp in second.logprobs] == [2]  # the dropped token's logprob goes too
    assert [lp.token_id for lp in second.logprobs[0][1]] == list(expected(a, 3, 2))
    assert live == set()  # finished by the rule, so the runner let it go at once
    assert third.sampled == ()


async def test_stop_id_mid_step_respects_min_tokens():
    def script(seq, index):
        return IM_END if index in (1, 5) else letters_script(seq, index)

    runner = FakeRunner(script=script, tokens_per_step=(4,))
    eager, patient = new_seq(A), new_seq(B, min_tokens=3)
    with trio.fail_after(TIMEOUT_S):
        async with running_executor(runner) as (plans, results):
            first = await step(plans, results, StepPlan(step_id=0, new_seqs=(eager, patient)))
            second = await step(plans, results, StepPlan(step_id=1, decode_ids=(B,)))
    sampled = dict(first.sampled)
    assert sampled[A] == (script(eager, 0), IM_END)  # EOS at the second token ends it there
    assert sampled[B] == tuple(script(patient, i) for i in range(4))  # held off by min_tokens
    assert second.sampled == ((B, (script(patient, 4), IM_END)),)
    assert runner.live_ids == set()


class TwoTokenKind(FakeRunner):
    """A runner kind as a program embedding the engine would pass it."""

    tokens_per_step = (2,)
    script = staticmethod(text_script("Hello from a fake runner."))


async def test_open_engine_runs_a_kind_it_is_given(fake_cfg):
    runners = with_runner("fake-two-token", TwoTokenKind)
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode="fake-two-token"))
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg, runners=runners) as engine:  # built from the table on the executor thread
            assert engine.model_info.model_path == "fake-runner"
            with await engine.submit("hi", SamplingParams(max_tokens=9, logprobs=0)) as stream:
                deltas = [d async for d in stream]
            stats = engine.statistics()
    assert "".join(d.text for d in deltas) == "Hello fro"  # max_tokens=9 falls mid-step
    assert sum(len(d.token_ids) for d in deltas) == 9 and deltas[0].token_ids == (deltas[0].token_ids[0],)
    assert sum(len(d.logprobs) for d in deltas) == 9 and deltas[-1].finish_reason == "length"
    assert stats.scheduler.num_steps == 5


async def test_a_stalled_runner_is_abandoned_and_fails_the_engine(fake_cfg, blocking_kind):
    mode, runners = blocking_kind
    cfg = attrs.evolve(
        fake_cfg,
        engine=attrs.evolve(fake_cfg.engine, mode=mode),
        limits=attrs.evolve(fake_cfg.limits, engine_stall_timeout_s=0.2),
    )
    with trio.fail_after(TIMEOUT_S):
        with pytest.raises(EngineStalledError):
            async with open_engine(cfg, runners=runners) as engine:
                with pytest.raises(EngineStalledError):
                    async for _delta in engine.generate("hi", SamplingParams(max_tokens=4)):
                        pass
        [runner] = BlockingRunner.instances
        assert runner.blocked.is_set() and not runner.closed.is_set()  # abandoned mid-step
        runner.release.set()
        await trio.to_thread.run_sync(runner.closed.wait, abandon_on_cancel=True)
    assert len(runner.plans) == 1


def test_the_inbox_tells_whether_a_queued_plan_starts_a_sequence():
    inbox = _Inbox()
    inbox.put(StepPlan(step_id=0, decode_ids=(A,)))
    assert not inbox.starts_waiting()
    assert [p.step_id for p in inbox.next_work()] == [0]
    inbox.put(StepPlan(step_id=1, new_seqs=(new_seq(B),)))
    assert inbox.starts_waiting()
    assert [p.step_id for p in inbox.next_work()] == [1] and not inbox.starts_waiting()


async def test_the_executor_builds_the_runner_with_the_event_a_waiting_request_sets():
    """The runner is given the inbox's event when it is built (nothing is patched onto it
    later); a ``RequestWaiting`` sent mid-plan sets it, and the next plan taken clears it."""
    made: list[FakeRunner] = []

    def build(request_waiting: threading.Event) -> FakeRunner:
        made.append(FakeRunner(block_at_step=0, request_waiting=request_waiting))
        return made[-1]

    plan_send, plan_recv = trio.open_memory_channel[StepPlan | RequestWaiting](0)
    result_send, result_recv = trio.open_memory_channel(FakeRunner.plans_in_flight)
    actor = ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=build)
    with trio.fail_after(TIMEOUT_S):
        async with trio.open_nursery() as nursery:
            await nursery.start(actor.run)
            with plan_send, result_recv:
                [runner] = made
                await plan_send.send(StepPlan(step_id=0, new_seqs=(new_seq(A),)))
                await trio.to_thread.run_sync(runner.blocked.wait)  # mid-plan
                before = runner.starts_waiting()
                await plan_send.send(RequestWaiting())
                await trio.testing.wait_all_tasks_blocked()  # the executor has put it in the inbox
                during = runner.starts_waiting()
                runner.release.set()
                await result_recv.receive()
                await step(plan_send, result_recv, StepPlan(step_id=1, decode_ids=(A,)))
                after = runner.starts_waiting()
    assert (before, during, after) == (False, True, False)


def test_the_inbox_hears_that_a_request_waits_until_the_next_plan_is_taken():
    inbox = _Inbox()
    inbox.request_waiting()
    assert inbox.starts_waiting()  # the plan running now ends its run-ahead
    inbox.put(StepPlan(step_id=0, decode_ids=(A,)))
    assert [p.step_id for p in inbox.next_work()] == [0] and not inbox.starts_waiting()


async def test_a_request_admitted_mid_plan_ends_the_plans_run_ahead(fake_cfg, blocking_kind):
    """The scheduler, holding a plan in flight, tells the executor (RequestWaiting on the plan
    edge) when a request arrives; the runner's ``starts_waiting`` then says so mid-plan."""
    mode, runners = blocking_kind
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode=mode))
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg, runners=runners) as engine, trio.open_nursery() as nursery:
            first = await engine.submit("hi", SamplingParams(max_tokens=3))
            [runner] = BlockingRunner.instances
            await trio.to_thread.run_sync(runner.blocked.wait)  # mid-plan now
            assert not runner.starts_waiting()
            second = await engine.submit("there", SamplingParams(max_tokens=3))
            while not runner.starts_waiting():
                await trio.testing.wait_all_tasks_blocked()  # the hint's hops through Trio
            runner.release.set()
            for stream in (first, second):
                nursery.start_soon(_drain, stream)


async def _drain(stream) -> None:
    with stream:
        async for _delta in stream:
            pass


class RunAheadKind(FakeRunner):
    """A kind whose plans run four steps, handing each earlier one over as it ends."""

    steps_per_plan = 4
    script = staticmethod(text_script("Hello from a fake runner."))


async def test_steps_handed_over_mid_plan_reach_the_client_one_by_one(fake_cfg):
    runners = with_runner("fake-run-ahead", RunAheadKind)
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode="fake-run-ahead"))
    results: dict[str, list] = {}

    async def one(engine, name: str, max_tokens: int) -> None:
        params = SamplingParams(max_tokens=max_tokens, logprobs=0, ignore_eos=True)
        with await engine.submit("hi", params, request_id=name) as stream:
            results[name] = [d async for d in stream]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg, runners=runners) as engine, trio.open_nursery() as nursery:
            nursery.start_soon(one, engine, "short", 2)  # ends inside a plan, in a step handed over
            nursery.start_soon(one, engine, "long", 9)
    stats = engine.statistics()
    assert [len(d.token_ids) for d in results["long"]] == [1] * 9  # each step as it ended
    assert "".join(d.text for d in results["long"]) == "Hello fro"
    assert [len(d.token_ids) for d in results["short"]] == [1, 1] and results["short"][-1].finish_reason == "length"
    assert sum(len(d.logprobs) for d in results["long"]) == 9
    assert stats.scheduler.num_finished == 2 and stats.scheduler.num_steps < 9  # plans of several steps
    assert stats.cache.num_leased == 0  # the short one's lease ended though it left mid-plan
