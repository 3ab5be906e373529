"""The KV budget end to end on the FakeExecutor (autojump_clock): requests that can never fit
are refused at once; when running requests outgrow the budget, the newest are preempted and
recomputed, every request finishes with the output it would have had, and the batch never
holds more than the budget."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.errors import PromptTooLongError
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.requests import chat

LONG = SamplingParams(max_tokens=120, ignore_eos=True)


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "question {}"


async def run_many(engine, num_requests: int, params: SamplingParams = LONG) -> dict[int, list[int]]:
    outputs: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        outputs[i] = [t async for d in engine.generate(chat(QUESTION.format(i)), params) for t in d.token_ids]

    async with trio.open_nursery() as nursery:
        for i in range(num_requests):
            nursery.start_soon(one, i)
    return outputs


async def test_requests_that_outgrow_the_budget_are_preempted_and_all_finish(autojump_clock):
    with trio.fail_after(60):
        async with open_fake_engine(step_s=0.01) as fake:
            unlimited = await run_many(fake.engine, 6)
        async with open_fake_engine(step_s=0.01, kv_budget_tokens=600) as fake:
            limited = await run_many(fake.engine, 6)
            stats = fake.engine.statistics()
            exposition = fake.engine.metrics.render().decode()
    assert limited == unlimited  # each request's tokens are the ones it had without preemption
    assert all(len(tokens) == LONG.max_tokens for tokens in limited.values())
    assert stats.scheduler.num_preemptions > 0
    assert f'vllm:num_preemptions_total{{model_name="demo:tiny"}} {stats.scheduler.num_preemptions}.0' in exposition
    assert fake.executor.peak_kv_tokens <= 600
    resumed = [s for p in fake.executor.plans for s in p.new_seqs if s.num_output_tokens]
    assert resumed and all(s.max_new_tokens == LONG.max_tokens - s.num_output_tokens for s in resumed)
    assert stats.num_requests == 0 and stats.cache.num_leased == 0 and stats.cache.pool.num_in_use == 0


async def test_a_request_that_can_never_fit_the_budget_is_refused_at_once(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(kv_budget_tokens=100) as fake:
            with pytest.raises(PromptTooLongError) as refused:
                await fake.engine.submit("x" * 40, SamplingParams(max_tokens=80))
            with pytest.raises(PromptTooLongError, match="your request has 100 input tokens"):
                await fake.engine.submit("x" * 100)
            await trio.testing.wait_all_tasks_blocked()
            assert fake.executor.plans == []  # never queued, never prefilled
            fits = await fake.engine.submit("x" * 40, SamplingParams(max_tokens=60))
            fits.close()
    message = str(refused.value)
    assert message.startswith("'max_tokens' or 'max_completion_tokens' is too large: 80. This model's maximum")
    assert "maximum context length is 100 tokens and your request has 40 input tokens (80 > 100 - 40)." in message
    assert "context is 4096 tokens; this server's KV cache budget (engine.kv_memory_mb) holds 100" in message
    assert refused.value.code == "context_length_exceeded" and refused.value.param == "max_tokens"


async def test_default_max_tokens_is_the_room_the_budget_leaves(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(kv_budget_tokens=100) as fake:
            deltas = fake.engine.generate("x" * 40, SamplingParams(ignore_eos=True))
            tokens = [t async for d in deltas for t in d.token_ids]
    assert len(tokens) == 60


async def test_a_client_leaving_while_preempted_frees_everything(autojump_clock):
    gate = StepGate()
    with trio.fail_after(30):
        async with open_fake_engine(step_s=0, gate=gate, kv_budget_tokens=200) as fake:
            async with trio.open_nursery() as nursery:
                streams = [await fake.engine.submit(chat(QUESTION.format(i)), LONG) for i in range(3)]
                gate.allow(1)
                await trio.testing.wait_all_tasks_blocked()
                while fake.engine.statistics().scheduler.num_preemptions == 0:
                    gate.allow(1)
                    await trio.testing.wait_all_tasks_blocked()
                stats = fake.engine.statistics().scheduler
                preempted = [r for r in stats.requests if r.phase == "preempted"]
                assert preempted and preempted[0].num_preemptions == 1
                gone = [s for s in streams if s.request_id == preempted[0].request_id][0]
                gone.close()  # the client of the preempted request leaves
                gate.allow(1)
                await trio.testing.wait_all_tasks_blocked()
                after = fake.engine.statistics()
                assert gone.request_id not in after.scheduler.waiting_ids
                assert gone.request_id not in after.scheduler.running_ids
                for stream in streams:
                    if stream is not gone:
                        nursery.start_soon(drain, stream)
                gate.allow(10_000)
            final = fake.engine.statistics()
    assert final.num_requests == 0 and final.cache.num_leased == 0 and final.cache.pool.num_in_use == 0


async def drain(stream) -> None:
    with stream:
        async for _ in stream:
            pass
