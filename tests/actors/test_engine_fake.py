"""The actors end to end on a pure-Trio FakeExecutor, under autojump_clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.errors import PromptTooLongError, QueueFullError
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer, StepGate, text_script
from vllm_mlx_trio.testing.harness import open_fake_engine

CHAT = [{"role": "user", "content": "hello"}]


async def collect(engine, prompt=CHAT, params=None):
    deltas = [d async for d in engine.generate(prompt, params)]
    return "".join(d.text for d in deltas), deltas[-1].finish_reason


async def test_generates_until_eos(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("Hello there.")) as fake:
            text, reason = await collect(fake.engine)
    assert (text, reason) == ("Hello there.", "stop")


async def test_max_tokens_finishes_with_length(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("abcdefgh")) as fake:
            text, reason = await collect(fake.engine, params=SamplingParams(max_tokens=3))
            stream = await fake.engine.submit(CHAT, SamplingParams(max_tokens=5))
            with stream:
                async for _ in stream:
                    pass
    assert (text, reason) == ("abc", "length")
    assert stream.usage.completion_tokens == 5
    tokenizer = FakeTokenizer()
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template(CHAT, add_generation_prompt=True))
    assert stream.usage.prompt_tokens == len(prompt_ids)


async def test_stop_string_across_tokens_is_trimmed(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("one two STOP three", then_eos=False), step_s=0) as fake:
            text, reason = await collect(fake.engine, params=SamplingParams(stop=("STOP",)))
            # the request is gone from the engine once the stream has ended (steps take no time:
            # once every task waits, the plan that drops it has run)
            await trio.testing.wait_all_tasks_blocked()
            stats = fake.engine.statistics()
    assert (text, reason) == ("one two ", "stop")
    assert stats.num_requests == 0
    assert stats.scheduler.running_ids == ()
    assert fake.executor.sequences == {}


async def test_multibyte_characters_never_stream_half_decoded(autojump_clock):
    phrase = "héllo ✓ 日本"
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script(phrase)) as fake:
            deltas = [d.text async for d in fake.engine.generate(CHAT)]
    assert "".join(deltas) == phrase
    assert all("\ufffd" not in d for d in deltas)


async def test_simple_mode_runs_one_and_queues_the_rest(autojump_clock):
    gate = StepGate()
    results = {}
    with trio.fail_after(10):
        async with open_fake_engine(
            overrides=("engine.mode=simple",), script=text_script("xyz"), gate=gate, step_s=0
        ) as fake:
            async with trio.open_nursery() as nursery:
                for i in range(3):

                    async def run(i=i):
                        results[i] = await collect(fake.engine, [{"role": "user", "content": f"q{i}"}])

                    nursery.start_soon(run)
                await trio.testing.wait_all_tasks_blocked()
                stats = fake.engine.statistics()
                assert stats.num_requests == 3 and stats.scheduler.num_running == 1
                gate.allow(100)
    assert results == {i: ("xyz", "stop") for i in range(3)}
    assert all(len(p.new_seqs) + len(p.decode_ids) <= 1 for p in fake.executor.plans)


async def test_full_engine_refuses_at_once(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(
            overrides=("limits.max_waiting=1", "engine.max_num_seqs=1"), gate=gate, step_s=0
        ) as fake:
            first = await fake.engine.submit(CHAT)
            second = await fake.engine.submit(CHAT)
            with pytest.raises(QueueFullError):
                await fake.engine.submit(CHAT)
            first.close()
            second.close()
            gate.allow(10)
            third = await fake.engine.submit(CHAT)  # slots are back once streams close
            third.close()


async def test_prompt_longer_than_context_is_refused(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine(max_context_tokens=32) as fake:
            with pytest.raises(PromptTooLongError, match="^This model's maximum context length is 32"):
                await fake.engine.submit("x" * 40)
            with pytest.raises(PromptTooLongError):
                await fake.engine.submit("x" * 10, SamplingParams(max_tokens=30))
            assert fake.executor.plans == []


async def test_break_aborts_within_one_step(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(overrides=("engine.mode=simple",), gate=gate, step_s=0) as fake:
            gate.allow(1)
            async for delta in fake.engine.generate(CHAT, SamplingParams(max_tokens=100)):
                first_text = delta.text
                break
            await trio.testing.wait_all_tasks_blocked()
            # The client is gone; the step already in flight (plan 1) is the last to decode it.
            assert fake.engine.statistics().num_requests == 0
            gate.allow(1)
            await trio.testing.wait_all_tasks_blocked()
            stats = fake.engine.statistics()
            assert stats.scheduler.running_ids == () and stats.cache.num_leased == 0
            assert stats.scheduler.num_aborted == 1
            gate.allow(1)  # the next plan drops the sequence from the executor
            await trio.testing.wait_all_tasks_blocked()
            plans = fake.executor.plans
            assert fake.executor.sequences == {}
    assert first_text
    assert len(plans) == 3
    assert plans[-1].finished_ids and not plans[-1].decode_ids


async def test_request_cancelled_while_queued_never_reaches_the_model(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(gate=gate, script=text_script("ab"), step_s=0) as fake:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(collect, fake.engine)
                await trio.testing.wait_all_tasks_blocked()
                with trio.move_on_after(0.5):
                    await collect(fake.engine, [{"role": "user", "content": "queued"}])
                assert fake.engine.statistics().num_requests == 1
                gate.allow(100)
            seen = {s.request_id for p in fake.executor.plans for s in p.new_seqs}
            stats = fake.engine.statistics()
    assert len(seen) == 1
    assert stats.scheduler.waiting_ids == () and stats.num_requests == 0
    assert stats.scheduler.num_aborted == 1
