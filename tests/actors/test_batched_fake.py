"""Batched scheduling and streaming on the FakeExecutor, deterministic under autojump_clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.testing.fake_executor import StepGate, text_script
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.requests import chat

CHAT = [{"role": "user", "content": "hello"}]


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "q{}"


async def delta_sizes(engine, params, prompt=CHAT) -> list[int]:
    return [len(d.token_ids) async for d in engine.generate(prompt, params)]


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_stream_interval_sends_first_token_then_every_n(autojump_clock, mode):
    script = text_script("abcdefghij", then_eos=False)
    with trio.fail_after(10):
        async with open_fake_engine(
            overrides=(f"engine.mode={mode}", "engine.stream_interval=4"), script=script
        ) as fake:
            default = await delta_sizes(fake.engine, SamplingParams(max_tokens=10))
            override = await delta_sizes(fake.engine, SamplingParams(max_tokens=10, stream_interval=3))
            texts = [d.text async for d in fake.engine.generate(CHAT, SamplingParams(max_tokens=10))]
    assert default == [1, 4, 4, 1]  # first at once, then every 4, the rest with the finish
    assert override == [1, 3, 3, 3]
    assert "".join(texts) == "abcdefghij"


async def test_batch_holds_at_most_max_num_seqs_in_arrival_order(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(
            overrides=("engine.max_num_seqs=3",), script=text_script("xyz"), gate=gate, step_s=0
        ) as fake:
            async with trio.open_nursery() as nursery:
                for i in range(5):
                    nursery.start_soon(delta_sizes, fake.engine, None, chat(QUESTION.format(i)))
                    await trio.testing.wait_all_tasks_blocked()
                queued = fake.engine.statistics().scheduler  # admissions are queued mid-step
                gate.allow(1)
                await trio.testing.wait_all_tasks_blocked()
                stats = fake.engine.statistics().scheduler
                gate.allow(100)
    plans = fake.executor.plans
    assert (queued.num_running, queued.num_waiting) == (1, 4)
    assert (stats.num_running, stats.num_waiting) == (3, 2)
    assert max(len(p.new_seqs) + len(p.decode_ids) for p in plans) == 3
    tokenizer = fake.engine.model_info.tokenizer
    prompts = [tuple(tokenizer.encode(tokenizer.apply_chat_template(chat(QUESTION.format(i))))) for i in range(5)]
    assert [s.prompt_token_ids for p in plans for s in p.new_seqs] == prompts  # FCFS


async def test_slow_consumer_is_coalesced_and_never_blocks_the_batch(autojump_clock):
    script = text_script("0123456789" * 5, then_eos=False)
    with trio.fail_after(30):
        async with open_fake_engine(script=script, step_s=0.01) as fake:
            slow = await fake.engine.submit(chat(QUESTION.format(1)), SamplingParams(max_tokens=50))
            with slow:
                fast = await delta_sizes(fake.engine, SamplingParams(max_tokens=50), chat(QUESTION.format(2)))
                # the fast request finished while nobody read the slow one's outbox
                slow_sizes = [len(d.token_ids) async for d in slow]
    assert sum(fast) == 50 and len(fast) > 10
    assert sum(slow_sizes) == 50 and len(slow_sizes) <= 4  # outbox holds 4: coalesced


async def test_break_in_batched_mode_frees_the_request_after_one_step(autojump_clock):
    """The scheduler forgets the request when the step in flight ends; with two plans in
    flight the executor drops it in the plan built next, the third one it runs."""
    gate = StepGate()
    seen: dict[str, object] = {}

    async def consume_one_delta(engine):
        stream = await engine.submit(CHAT, SamplingParams(max_tokens=100))
        seen["id"] = stream.request_id
        with stream:
            async for _delta in stream:
                break
        seen["plans_at_break"] = len(fake.executor.plans)

    with trio.fail_after(10):
        async with open_fake_engine(gate=gate, step_s=0) as fake:
            others = [
                await fake.engine.submit(chat(QUESTION.format(i)), SamplingParams(max_tokens=100)) for i in (1, 2)
            ]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(consume_one_delta, fake.engine)
                while "plans_at_break" not in seen:
                    gate.allow(1)
                    await trio.testing.wait_all_tasks_blocked()
            gate.allow(1)
            await trio.testing.wait_all_tasks_blocked()
            stats = fake.engine.statistics()
            gate.allow(2)
            await trio.testing.wait_all_tasks_blocked()
            after = fake.executor.plans[seen["plans_at_break"] :]
            for stream in others:
                stream.close()
            gate.allow(100)
    assert stats.scheduler.num_aborted == 1 and seen["id"] not in stats.scheduler.running_ids
    assert stats.num_requests == 2 and stats.cache.num_leased == 2
    assert len(after) == 3 and after[-1].finished_ids == (seen["id"],)
    assert seen["id"] not in after[-1].decode_ids


async def test_logprobs_travel_with_their_tokens(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(overrides=("engine.stream_interval=3",), script=text_script("abcdefg")) as fake:
            deltas = [d async for d in fake.engine.generate(CHAT, SamplingParams(logprobs=2))]
            plain = [d async for d in fake.engine.generate(CHAT)]
    assert [len(d.logprobs) for d in deltas] == [len(d.token_ids) for d in deltas]
    assert [lp.token_id for d in deltas for lp in d.logprobs] == [t for d in deltas for t in d.token_ids]
    assert all(len(lp.top) == 2 for d in deltas for lp in d.logprobs)
    assert all(d.logprobs == () for d in plain)
