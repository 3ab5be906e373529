"""A client that leaves is noticed where the scheduler hears of it, never by looking at its
outbox between sends: the send to a closed outbox fails, or the closed stream's ``Departed``
arrives (for a request that gets nothing to send for a while). On the FakeExecutor, or on a
scheduler whose executor the test plays, under autojump_clock."""

from __future__ import annotations

import attrs
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams, load_config
from vllm_mlx_trio.actors.prefix.cache_manager import CacheManagerActor
from vllm_mlx_trio.actors.scheduler.settings import SchedulerSettings
from vllm_mlx_trio.messages import Admit, Departed, RequestId, StepPlan, StepResult
from vllm_mlx_trio.testing.fake_executor import IM_END, StepGate, text_script
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.wired import Wired

CHAT = [{"role": "user", "content": "hello"}]


async def test_a_client_leaving_between_deliveries_is_dropped_before_the_next_step(autojump_clock):
    """With a stream interval of 50 tokens nothing is sent to the client for 49 steps: only its
    ``Departed`` can tell the scheduler, which drops it before the next plan."""
    gate = StepGate()
    overrides = ("engine.stream_interval=50",)
    with trio.fail_after(10):
        async with open_fake_engine(overrides=overrides, gate=gate, script=text_script("ab", then_eos=False)) as fake:
            engine, plans = fake.engine, fake.executor.plans
            stream = await engine.submit(CHAT, SamplingParams(max_tokens=500), request_id="quiet")
            gate.allow(4)
            first = await stream.__anext__()  # the first token goes at once, the next ones wait
            await trio.sleep(1)  # the other steps ran; the plans after them wait for the gate
            assert engine.statistics().scheduler.running_ids == ("quiet",)
            stream.close()
            sent_before = len(plans)
            gate.allow(100)
            await trio.sleep(1)
            stats = engine.statistics()
            later = plans[sent_before:]
    assert first.token_ids and stats.scheduler.running_ids == () and stats.scheduler.num_aborted == 1
    # only the plans already in flight (two, batched) still decode it; the next one drops it
    decoding = [p for p in later if "quiet" in p.decode_ids]
    assert len(decoding) <= 2 and any("quiet" in p.finished_ids for p in later)
    assert not engine.holds_request("quiet")


@attrs.define
class CountingOutbox:
    """An outbox (the scheduler's side of a request's channel) that counts ``statistics()``."""

    channel: trio.MemorySendChannel
    looks: int = 0

    def send_nowait(self, value) -> None:
        self.channel.send_nowait(value)

    def close(self) -> None:
        self.channel.close()

    def statistics(self):
        self.looks += 1
        return self.channel.statistics()


def admit(rid: str, outbox) -> Admit:
    return Admit(
        request_id=RequestId(rid),
        prompt_token_ids=(5, 6, 7),
        params=SamplingParams(max_tokens=50),
        outbox=outbox,
        arrival_time=0.0,
    )


async def play_steps(plan_recv, result_send, n: int) -> None:
    """Answer ``n`` plans as the executor would: one token for each running request."""
    for _ in range(n):
        plan: StepPlan = await plan_recv.receive()
        running = (*(s.request_id for s in plan.new_seqs), *plan.decode_ids)
        await result_send.send(StepResult(step_id=plan.step_id, sampled=tuple((rid, (40,)) for rid in running)))


async def test_a_queued_request_is_never_looked_at_and_leaves_when_its_client_says_so(autojump_clock):
    wired = Wired.build(SchedulerSettings(eos_token_ids=(IM_END,), max_running=1))
    cache = CacheManagerActor(
        command_recv=wired.cache_recv, reply_send=wired.match_send, cfg=load_config(None, environ={}).cache
    )
    running_send, running_recv = trio.open_memory_channel(4)
    queued_send, queued_recv = trio.open_memory_channel(4)
    queued = CountingOutbox(queued_send)
    with (
        trio.fail_after(10),
        wired.admit_send,
        wired.control_send,
        wired.depart_send,
        wired.plan_recv,
        wired.result_send,
        running_recv,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            await nursery.start(wired.scheduler.run)
            await wired.admit_send.send(admit("running", running_send))
            await wired.admit_send.send(admit("queued", queued))
            await play_steps(wired.plan_recv, wired.result_send, 5)
            looks_while_queued = queued.looks
            queued_recv.close()  # the client leaves: its stream's close says so
            wired.depart_send.send_nowait(Departed(request_id=RequestId("queued")))
            await play_steps(wired.plan_recv, wired.result_send, 1)
            await trio.testing.wait_all_tasks_blocked()
            stats = wired.scheduler.statistics()
            held = wired.scheduler.holds("queued"), wired.scheduler.holds("running")
            nursery.cancel_scope.cancel()
    assert looks_while_queued == 0  # no per-step look at a queued request's outbox
    assert stats.waiting_ids == () and stats.running_ids == ("running",) and stats.num_aborted == 1
    assert held == (False, True)


async def test_a_departure_for_a_request_no_longer_held_changes_nothing(autojump_clock):
    """A ``Departed`` that arrives after its request finished (or was never admitted) is dropped."""
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("ok")) as fake:
            engine = fake.engine
            with await engine.submit(CHAT, SamplingParams(max_tokens=2), request_id="done") as stream:
                text = "".join([d.text async for d in stream])
            engine._depart_send.send_nowait(Departed(request_id=RequestId("done")))
            engine._depart_send.send_nowait(Departed(request_id=RequestId("never")))
            after = "".join([d.text async for d in engine.generate(CHAT, SamplingParams(max_tokens=2))])
            stats = engine.statistics()
    assert text == after == "ok"
    assert stats.scheduler.num_aborted == 0 and stats.scheduler.num_finished == 2
