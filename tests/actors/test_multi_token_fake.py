"""Several tokens per step, end to end on the FakeExecutor (autojump_clock): the scheduler's
``Request``, stop strings, ``min_tokens``, logprobs, coalescing and the KV lookahead all
count accepted tokens, whatever a step gave."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer, text_script
from vllm_mlx_trio.testing.fake_runner import FakeRunner
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.worker.registry import with_runner

CHAT = [{"role": "user", "content": "hello"}]
TOKENIZER = FakeTokenizer()


class SpeculativeKind(FakeRunner):
    """A kind that may give 4 tokens a step (the scheduler reads its shape)."""

    plans_in_flight = 1
    max_tokens_per_step = 4


@pytest.fixture
def speculative_kind():
    return "fake-speculative", with_runner("fake-speculative", SpeculativeKind)


async def collect(engine, params, prompt=CHAT):
    with await engine.submit(prompt, params) as stream:
        deltas = [d async for d in stream]
    return deltas, stream


def text_of(deltas) -> str:
    return "".join(d.text for d in deltas)


async def test_min_tokens_holds_off_stop_strings(autojump_clock):
    params = SamplingParams(min_tokens=30, stop=(" ",), max_tokens=100)
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("ab cd ef gh ij kl mn op qr st uv wx yz")) as fake:
            deltas, stream = await collect(fake.engine, params)
    # the first 30 tokens' text is never searched; the first space after them stops it
    assert text_of(deltas) == "ab cd ef gh ij kl mn op qr st uv"
    assert deltas[-1].finish_reason == "stop"
    assert stream.usage.completion_tokens == 33  # up to and including the stopping space


@pytest.mark.parametrize("tokens_per_step", [1, 2, 3, 4, (1, 4, 2, 3)])
async def test_max_tokens_falling_mid_step(autojump_clock, tokens_per_step):
    params = SamplingParams(max_tokens=7, logprobs=1)
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("abcdefghijkl"), tokens_per_step=tokens_per_step) as fake:
            deltas, stream = await collect(fake.engine, params)
    assert text_of(deltas) == "abcdefg" and deltas[-1].finish_reason == "length"
    assert stream.usage.completion_tokens == 7
    logprobs = [lp.token_id for d in deltas for lp in d.logprobs]
    assert logprobs == [t for d in deltas for t in d.token_ids]  # the dropped tokens' went too


@pytest.mark.parametrize("tokens_per_step", [1, 3, 4])
async def test_stop_string_mid_step_drops_the_tokens_after_it(autojump_clock, tokens_per_step):
    params = SamplingParams(stop=("STOP",), logprobs=0, max_tokens=50)
    script = text_script("ab STOP cdefgh", then_eos=False)
    with trio.fail_after(10):
        async with open_fake_engine(script=script, tokens_per_step=tokens_per_step) as fake:
            deltas, stream = await collect(fake.engine, params)
    assert text_of(deltas) == "ab " and deltas[-1].finish_reason == "stop"
    tokens = [t for d in deltas for t in d.token_ids]
    assert tokens == TOKENIZER.encode("ab STOP")  # nothing after the P that completed it
    assert [lp.token_id for d in deltas for lp in d.logprobs] == tokens
    assert stream.usage.completion_tokens == len(tokens)


@pytest.mark.parametrize("tokens_per_step", [1, 2, 4])
async def test_eos_mid_step_ends_there_unless_min_tokens(autojump_clock, tokens_per_step):
    script = text_script("hello")  # then EOS, then "hello" again from the script's index
    with trio.fail_after(10):
        async with open_fake_engine(script=script, tokens_per_step=tokens_per_step) as fake:
            deltas, stream = await collect(fake.engine, SamplingParams(max_tokens=20))
    assert text_of(deltas) == "hello" and deltas[-1].finish_reason == "stop"
    assert stream.usage.completion_tokens == 6  # EOS delivered, the rest of its step dropped


async def test_stream_interval_counts_tokens_not_steps(autojump_clock):
    params = SamplingParams(max_tokens=15, stream_interval=5, ignore_eos=True)
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("abcdefghijklmnopqrstuvwxyz"), tokens_per_step=2) as fake:
            deltas, _stream = await collect(fake.engine, params)
    # the first token alone, then 5 at a time though steps give 2, then what is left with the finish
    assert [len(d.token_ids) for d in deltas] == [1, 5, 5, 4]
    assert text_of(deltas) == "abcdefghijklmno"


async def test_interval_one_sends_a_steps_tokens_together_after_the_first(autojump_clock):
    params = SamplingParams(max_tokens=11, ignore_eos=True)
    with trio.fail_after(10):
        async with open_fake_engine(script=text_script("abcdefghijklmnopqrstuvwxyz"), tokens_per_step=3) as fake:
            deltas, _stream = await collect(fake.engine, params)
    # the first token alone, the rest of its step next, then each step's tokens as one output
    assert [len(d.token_ids) for d in deltas] == [1, 2, 3, 3, 2]
    assert text_of(deltas) == "abcdefghijk"


async def test_kv_lookahead_counts_tokens_per_step(autojump_clock, fake_cfg, speculative_kind):
    mode, runners = speculative_kind
    cfg = attrs.evolve(fake_cfg, engine=attrs.evolve(fake_cfg.engine, mode=mode, max_num_seqs=6))
    params = SamplingParams(max_tokens=120, ignore_eos=True)

    async def run_all(**kwargs):
        outputs = {}
        async with open_fake_engine(cfg, runners=runners, step_s=0.01, tokens_per_step=4, **kwargs) as fake:
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, fake.engine, i, outputs)
        return outputs, fake

    async def one(engine, i, outputs):
        deltas, _ = await collect(engine, params, prompt=[{"role": "user", "content": f"question {i}"}])
        outputs[i] = [t for d in deltas for t in d.token_ids]

    with trio.fail_after(60):
        unlimited, _ = await run_all()
        limited, fake = await run_all(kv_budget_tokens=600)
    assert limited == unlimited and all(len(tokens) == 120 for tokens in limited.values())
    assert fake.engine.statistics().scheduler.num_preemptions > 0
    assert fake.executor.peak_kv_tokens <= 600  # 4 tokens a step never overrun the budget
