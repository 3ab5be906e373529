"""Priority preemption end to end on the FakeExecutor (autojump_clock): a request of a higher
priority that arrives when every slot is taken preempts the lowest-priority running one, runs
at once, and the preempted one later finishes with exactly the tokens it would have had."""

from __future__ import annotations

import trio
import trio.testing

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.requests import chat

LOW = SamplingParams(max_tokens=40, ignore_eos=True, priority=5)
HIGH = SamplingParams(max_tokens=8, ignore_eos=True, priority=0)
ONE_SLOT = ("engine.max_num_seqs=1",)


async def tokens_of(stream, order: list[str], name: str) -> list[int]:
    with stream:
        tokens = [t async for d in stream for t in d.token_ids]
    order.append(name)
    return tokens


async def test_a_higher_priority_preempts_a_full_batch_and_outputs_stay_the_same(autojump_clock):
    with trio.fail_after(60):
        async with open_fake_engine(overrides=ONE_SLOT, step_s=0.01) as fake:
            alone_low = [t async for d in fake.engine.generate(chat("low"), LOW) for t in d.token_ids]
            alone_high = [t async for d in fake.engine.generate(chat("high"), HIGH) for t in d.token_ids]
        gate = StepGate()
        async with open_fake_engine(overrides=ONE_SLOT, step_s=0, gate=gate) as fake:
            order: list[str] = []
            outputs: dict[str, list[int]] = {}

            async def run(name: str, stream) -> None:
                outputs[name] = await tokens_of(stream, order, name)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "low", await fake.engine.submit(chat("low"), LOW))
                gate.allow(5)  # low is in the batch and has streamed a few tokens
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(run, "high", await fake.engine.submit(chat("high"), HIGH))
                gate.allow(1)  # the step in flight ends: high starts in the next plan, low leaves it
                await trio.testing.wait_all_tasks_blocked()
                stats = fake.engine.statistics()
                gate.allow(10_000)
            final = fake.engine.statistics()
            exposition = fake.engine.metrics.render().decode()
    assert [r.phase for r in stats.scheduler.requests if r.num_preemptions] == ["preempted"]
    assert order == ["high", "low"]  # high ran at once, low finished after it
    assert outputs == {"low": alone_low, "high": alone_high}
    assert final.scheduler.num_preemptions == 1
    assert 'vllm:num_preemptions_total{model_name="demo:tiny"} 1.0' in exposition
    assert final.num_requests == 0 and final.cache.num_leased == 0 and final.cache.pool.num_in_use == 0
    resumed = [s for p in fake.executor.plans for s in p.new_seqs if s.num_output_tokens]
    assert len(resumed) == 1 and resumed[0].params.priority == 5


async def test_equal_priorities_wait_their_turn(autojump_clock):
    same = SamplingParams(max_tokens=8, ignore_eos=True, priority=5)
    with trio.fail_after(60):
        async with open_fake_engine(overrides=ONE_SLOT, step_s=0.01) as fake:
            order: list[str] = []
            async with trio.open_nursery() as nursery:
                first = await fake.engine.submit(chat("first"), LOW)
                nursery.start_soon(tokens_of, first, order, "first")
                await trio.sleep(0.05)
                second = await fake.engine.submit(chat("second"), same)
                nursery.start_soon(tokens_of, second, order, "second")
            assert fake.engine.statistics().scheduler.num_preemptions == 0
    assert order == ["first", "second"]
