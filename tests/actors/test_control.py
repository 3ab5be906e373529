"""Operator actions as commands on the control channel, the engine's failure as an event that
stops the scheduler's stepping, and the facade's cheap questions (``wait_empty``,
``holds_request``): on the FakeExecutor under autojump_clock."""

from __future__ import annotations

import collections

import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams, load_config
from vllm_mlx_trio.actors.prefix.cache_manager import CacheManagerActor
from vllm_mlx_trio.actors.scheduler.actor import SchedulerActor
from vllm_mlx_trio.actors.scheduler.control_inbox import ControlInbox
from vllm_mlx_trio.actors.topology import CONTROL_BUFFER
from vllm_mlx_trio.errors import EngineClosedError, EngineStalledError
from vllm_mlx_trio.health import EngineFailed
from vllm_mlx_trio.http.request_log import EngineIds
from vllm_mlx_trio.messages import ClearPrefixCache, FailAll, PrefixLookup, RequestFailed
from vllm_mlx_trio.testing.fake_executor import StepGate, text_script
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.wired import Wired

CHAT = [{"role": "user", "content": "hello"}]
ONE_RUNNING = ("engine.max_num_seqs=1",)


async def drain(stream) -> str:
    with stream:
        return "".join([d.text async for d in stream])


async def test_fail_requests_fails_queued_and_running_in_band_and_the_engine_goes_on(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(overrides=ONE_RUNNING, gate=gate, script=text_script("ok", then_eos=False)) as fake:
            engine = fake.engine
            running = await engine.submit(CHAT, SamplingParams(max_tokens=50))
            queued = await engine.submit(CHAT, SamplingParams(max_tokens=50))
            await trio.testing.wait_all_tasks_blocked()
            assert engine.statistics().scheduler.num_waiting == 1  # one running, one queued
            engine.fail_requests(EngineClosedError("drain deadline"))
            gate.allow(1)  # the scheduler acts between two steps: once the step in flight is back
            for stream in (running, queued):
                with pytest.raises(EngineClosedError, match="drain deadline"):
                    await drain(stream)
            gate.allow(100)
            after = await drain(await engine.submit(CHAT, SamplingParams(max_tokens=2)))
            stats = engine.statistics()
    assert after == "ok"
    assert stats.num_requests == 0 and stats.scheduler.running_ids == () and stats.scheduler.waiting_ids == ()


async def test_fail_requests_more_often_than_the_channel_holds_never_raises(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(gate=gate) as fake:
            stream = await fake.engine.submit(CHAT, SamplingParams(max_tokens=50))
            await trio.testing.wait_all_tasks_blocked()
            for i in range(3 * CONTROL_BUFFER):  # no checkpoint: the scheduler takes none of them yet
                fake.engine.fail_requests(EngineClosedError(f"failure {i}"))
            gate.allow(1)
            with pytest.raises(EngineClosedError, match="failure 0$"):
                await drain(stream)
            gate.allow(100)


async def test_operator_actions_after_the_engine_stopped(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine() as fake:
            assert await fake.engine.clear_prefix_cache() == 0  # answered through the control channel
    with pytest.raises(EngineClosedError, match="before the cache was cleared"):
        await fake.engine.clear_prefix_cache()
    fake.engine.fail_requests(EngineClosedError("nothing left to fail"))  # and no error


async def test_unanswered_commands_are_refused_when_the_scheduler_stops():
    control_send, control_recv = trio.open_memory_channel(CONTROL_BUFFER)
    wakes: list[None] = []
    inbox = ControlInbox(control_recv, wake=lambda: wakes.append(None))
    replies = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(inbox.receive)
            for _ in range(3):
                reply_send, reply_recv = trio.open_memory_channel[int](1)
                await control_send.send(ClearPrefixCache(reply=reply_send))
                replies.append(reply_recv)
            await control_send.send(FailAll(error=EngineClosedError("x")))
            await trio.testing.wait_all_tasks_blocked()
            assert len(wakes) == 1  # one command at a time is handed to the loop
            inbox.refuse_all()
            nursery.cancel_scope.cancel()
    for reply_recv in replies:
        with pytest.raises(trio.EndOfChannel):
            reply_recv.receive_nowait()


async def test_a_failure_in_health_stops_a_step_that_never_returns(autojump_clock):
    """The executor edge stays open and the step never answers: only the failure event (not a
    closed channel) can wake the scheduler; every request fails with the recorded cause, and
    a cache clear sent afterwards hears that the engine has stopped."""
    wired = Wired.build()
    cfg = load_config(None, environ={}).cache
    cache = CacheManagerActor(command_recv=wired.cache_recv, reply_send=wired.match_send, cfg=cfg)
    with trio.fail_after(10), wired.depart_send, wired.plan_recv, wired.result_send:
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            await nursery.start(wired.scheduler.run)
            outbox = await wired.admit()
            plan = await wired.plan_recv.receive()  # a step in flight, never answered
            assert [s.request_id for s in plan.new_seqs] == ["r"]
            wired.health.report(EngineFailed(error=EngineStalledError("stuck")))
            failed = await outbox.receive()
            reply_send, reply_recv = trio.open_memory_channel[int](1)
            await wired.control_send.send(ClearPrefixCache(reply=reply_send))
            with pytest.raises(trio.EndOfChannel):
                await reply_recv.receive()
            wired.admit_send.close()
    assert isinstance(failed, RequestFailed) and failed.error is wired.health.snapshot().error


async def test_a_failure_during_a_prefix_lookup_still_fails_the_request(autojump_clock):
    """The stepping is cancelled while a request is between the queue and the batch (its
    prefix lookup unanswered): it must not be lost, its client gets the cause."""
    wired = Wired.build()
    with trio.fail_after(10), wired.depart_send, wired.plan_recv, wired.result_send, wired.cache_recv, wired.match_send:
        async with trio.open_nursery() as nursery:
            await nursery.start(wired.scheduler.run)
            outbox = await wired.admit()
            lookup = await wired.cache_recv.receive()  # never answered
            assert isinstance(lookup, PrefixLookup)
            wired.health.report(EngineFailed(error=EngineStalledError("stuck")))
            failed = await outbox.receive()
            wired.admit_send.close()
    assert isinstance(failed, RequestFailed) and failed.error is wired.health.snapshot().error


async def test_wait_empty_wakes_when_the_last_stream_closes(autojump_clock):
    gate = StepGate()
    woke_at: list[float] = []
    closed_at: list[float] = []
    with trio.fail_after(10):
        async with open_fake_engine(gate=gate) as fake:
            engine = fake.engine
            await engine.wait_empty()  # nothing inside: returns at once
            streams = [await engine.submit(CHAT) for _ in range(2)]

            async def wait() -> None:
                await engine.wait_empty()
                woke_at.append(trio.current_time())

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                for stream in streams:
                    await trio.sleep(1.003)
                    assert not woke_at
                    stream.close()
                    closed_at.append(trio.current_time())
            gate.allow(100)
    assert woke_at == closed_at[-1:]  # the same instant: woken, not polled


async def test_holds_request_follows_the_scheduler_without_a_snapshot(autojump_clock, monkeypatch):
    gate = StepGate()

    def no_snapshots(self):
        raise AssertionError("statistics() built for a request id")

    with trio.fail_after(10):
        async with open_fake_engine(gate=gate, step_s=0) as fake:
            engine = fake.engine
            monkeypatch.setattr(SchedulerActor, "statistics", no_snapshots)
            stream = await engine.submit(CHAT, request_id="abc")
            await trio.testing.wait_all_tasks_blocked()
            ids = EngineIds(engine)
            held = (engine.holds_request("abc"), engine.holds_request("other"))
            reserved = (ids.reserve("abc", 1), ids.reserve("other", 2), ids.reserve("other", 1))
            stream.close()
            gate.allow(100)
            await trio.testing.wait_all_tasks_blocked()  # steps take no time: the scheduler has let go
            gone = engine.holds_request("abc")
    assert held == (True, False)
    assert reserved == (["abc~2"], ["other-0", "other-1"], ["other"])
    assert gone is False


class _NoScan(collections.deque):
    """A waiting queue that fails the test if anyone walks it."""

    def __iter__(self):
        raise AssertionError("the waiting queue was scanned for a request id")


async def test_holds_request_looks_the_id_up_without_scanning_the_queue(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(overrides=ONE_RUNNING, gate=gate) as fake:
            engine = fake.engine
            streams = [await engine.submit(CHAT, request_id=rid) for rid in ("running", "q0", "q1")]
            await trio.testing.wait_all_tasks_blocked()
            core = engine._scheduler._scheduler
            assert len(core.waiting) == 2
            waiting, core.waiting = core.waiting, _NoScan(core.waiting)
            try:
                held = [engine.holds_request(rid) for rid in ("running", "q0", "q1", "other")]
            finally:
                core.waiting = waiting
            for stream in streams:
                stream.close()
            gate.allow(100)
            await trio.sleep(1)
            gone = [engine.holds_request(rid) for rid in ("running", "q0", "q1")]
    assert held == [True, True, True, False]
    assert gone == [False, False, False]
