"""Batched mode on the real demo model: every request parameter honoured inside a shared
batch, greedy determinism in float32, chunked prefill that does not starve decoding."""

from __future__ import annotations

import functools

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.requests import chat

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
EOS = 2  # <|im_end|> in the demo tokenizer
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def config(model_dir: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "Tell me about number {} and the sea."


async def tokens_of(engine, prompt, params, *, progress: trio.Event | None = None) -> list[int]:
    out: list[int] = []
    async for delta in engine.generate(prompt, params):
        out.extend(delta.token_ids)
        if progress is not None and len(out) >= 8:
            progress.set()
    return out


async def run_all(engine, jobs) -> dict:
    results = {}

    async def one(key, prompt, params):
        results[key] = await tokens_of(engine, prompt, params)

    async with trio.open_nursery() as nursery:
        for key, (prompt, params) in jobs.items():
            nursery.start_soon(one, key, prompt, params)
    return results


async def test_greedy_is_the_same_alone_in_a_batch_of_8_and_arriving_mid_decode(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir)) as engine:
            alone = await tokens_of(engine, chat(QUESTION.format(3)), GREEDY)
            batch = await run_all(engine, {i: (chat(QUESTION.format(i)), GREEDY) for i in range(8)})
            long = attrs.evolve(GREEDY, max_tokens=64)
            late = {}
            async with trio.open_nursery() as nursery:
                started = trio.Event()
                for i in range(4):
                    nursery.start_soon(
                        functools.partial(tokens_of, engine, chat(QUESTION.format(10 + i)), long, progress=started)
                    )
                await started.wait()  # the others are mid-decode now
                late["probe"] = await tokens_of(engine, chat(QUESTION.format(3)), GREEDY)
    assert len(alone) == GREEDY.max_tokens
    assert batch[3] == alone
    assert late["probe"] == alone


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_each_parameter_is_honoured_inside_a_mixed_batch(float32_dir, mode):
    seeded = SamplingParams(temperature=1.5, seed=7, max_tokens=16, ignore_eos=True)
    forced = SamplingParams(temperature=0.0, max_tokens=6, logit_bias=((300, 100.0),))
    early_eos = SamplingParams(temperature=0.0, max_tokens=20, logit_bias=((EOS, 100.0),), min_tokens=4)
    jobs = {
        "top_k1": (chat(QUESTION.format(1)), SamplingParams(temperature=1.5, top_k=1, max_tokens=16, ignore_eos=True)),
        "hot": (chat(QUESTION.format(2)), SamplingParams(temperature=1.5, max_tokens=16, ignore_eos=True)),
        "seeded": (chat(QUESTION.format(4)), seeded),
        "forced": (chat(QUESTION.format(5)), forced),
        "early_eos": (chat(QUESTION.format(6)), early_eos),
        "ignore_eos": (chat(QUESTION.format(7)), attrs.evolve(early_eos, min_tokens=0, ignore_eos=True, max_tokens=5)),
        "penalised": (chat(QUESTION.format(8)), attrs.evolve(GREEDY, presence_penalty=2.0, frequency_penalty=2.0)),
    }
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, f"engine.mode={mode}")) as engine:
            mixed = await run_all(engine, jobs)
            greedy_alone = await tokens_of(engine, chat(QUESTION.format(1)), attrs.evolve(GREEDY, max_tokens=16))
            seeded_alone = await tokens_of(engine, chat(QUESTION.format(4)), seeded)
            plain_alone = await tokens_of(engine, chat(QUESTION.format(8)), GREEDY)
    assert mixed["top_k1"] == greedy_alone  # top_k=1 is greedy whatever the temperature
    assert mixed["seeded"] == seeded_alone  # a seed reproduces its draws inside a batch
    assert mixed["forced"] == [300] * 6  # logit_bias +100 wins every step
    assert mixed["early_eos"] == [*mixed["early_eos"][:4], EOS] and EOS not in mixed["early_eos"][:4]
    assert mixed["ignore_eos"] == [EOS] * 5  # EOS sampled but generation goes on
    penalised = mixed["penalised"]
    assert penalised != plain_alone and len(set(penalised)) > len(set(plain_alone))


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_logprobs_match_a_direct_model_call(float32_dir, mode):
    import mlx.core as mx
    import mlx_lm

    model, tokenizer = mlx_lm.load(float32_dir)
    text = tokenizer.apply_chat_template(chat(QUESTION.format(0)), add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
    expected = (logits - mx.logsumexp(logits)).tolist()
    expected_top = sorted(range(len(expected)), key=lambda t: -expected[t])[:3]
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, f"engine.mode={mode}")) as engine:
            params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=3)
            others = [engine.generate(chat(QUESTION.format(i)), GREEDY) for i in (1, 2)]
            async with trio.open_nursery() as nursery:
                for gen in others:
                    nursery.start_soon(_drain, gen)
                deltas = [d async for d in engine.generate(chat(QUESTION.format(0)), params)]
    first = deltas[0].logprobs[0]
    assert first.token_id == expected_top[0]
    assert first.logprob == pytest.approx(expected[first.token_id], abs=1e-4)
    assert [t for t, _ in first.top] == expected_top
    assert [v for _, v in first.top] == pytest.approx([expected[t] for t in expected_top], abs=1e-4)
    assert sum(len(d.logprobs) for d in deltas) == sum(len(d.token_ids) for d in deltas) == 3


async def _drain(gen) -> None:
    async for _ in gen:
        pass


async def test_aborting_one_request_leaves_the_others_unchanged(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir)) as engine:
            solo = {i: await tokens_of(engine, chat(QUESTION.format(i)), GREEDY) for i in range(3)}
            results = {}

            async def run(i):
                results[i] = await tokens_of(engine, chat(QUESTION.format(i)), GREEDY)

            async def abort_early():
                async for _delta in engine.generate(chat(QUESTION.format(9)), GREEDY):
                    break

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(run, i)
                nursery.start_soon(abort_early)
            stats = engine.statistics()
    assert results == solo
    assert stats.scheduler.num_aborted == 1 and stats.scheduler.running_ids == ()


async def test_long_prompt_prefill_is_chunked_between_decode_steps(float32_dir):
    """While a long prompt prefills in 16-token chunks, a running stream keeps getting tokens."""
    long_prompt = [{"role": "user", "content": "the sea and the sky " * 120}]
    arrivals: list[str] = []
    streaming = trio.Event()  # the short stream has its first 5 tokens

    async def short():
        async for delta in engine.generate(chat(QUESTION.format(1)), attrs.evolve(GREEDY, max_tokens=200)):
            arrivals.extend("s" * len(delta.token_ids))
            if len(arrivals) >= 5:
                streaming.set()

    async def long(started: trio.Event):
        await started.wait()
        arrivals.append("L-submitted")
        async for _delta in engine.generate(long_prompt, attrs.evolve(GREEDY, max_tokens=2)):
            arrivals.append("L")

    cfg = config(float32_dir, "engine.prefill_step_size=16")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            started = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(short)
                nursery.start_soon(long, started)
                await streaming.wait()
                started.set()
    window = arrivals[arrivals.index("L-submitted") : arrivals.index("L")]
    # ~600 prompt tokens at 16 per step: dozens of steps, each one decoding the short stream
    assert window.count("s") >= 20


@pytest.mark.parametrize("mode", ["batched", "simple"])
async def test_a_failing_logits_processor_ends_only_its_request(float32_dir, mode, monkeypatch):
    from vllm_mlx_trio.errors import RequestProcessingError
    from vllm_mlx_trio.worker import simple_runner
    from vllm_mlx_trio.worker.batched import runner as batch_runner

    runner_module = batch_runner if mode == "batched" else simple_runner
    original = runner_module.make_request_processors

    def with_a_bomb(params, *, stop_ids, generated=()):
        if params.min_tokens == 3:  # marks the request that fails on its third token
            calls = []

            def bomb(context, logits):
                calls.append(1)
                if len(calls) == 3:
                    raise ValueError("processor exploded")
                return logits

            return [*original(params, stop_ids=stop_ids, generated=generated), bomb]
        return original(params, stop_ids=stop_ids, generated=generated)

    monkeypatch.setattr(runner_module, "make_request_processors", with_a_bomb)
    bad = attrs.evolve(GREEDY, min_tokens=3)
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, f"engine.mode={mode}")) as engine:
            solo = {i: await tokens_of(engine, chat(QUESTION.format(i)), GREEDY) for i in (1, 2)}
            results, errors = {}, []

            async def good(i):
                results[i] = await tokens_of(engine, chat(QUESTION.format(i)), GREEDY)

            async def failing():
                with pytest.raises(RequestProcessingError, match="processor exploded") as info:
                    await tokens_of(engine, chat(QUESTION.format(9)), bad)
                errors.append(info.value)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(good, 1)
                nursery.start_soon(failing)
                nursery.start_soon(good, 2)
            after = await tokens_of(engine, chat(QUESTION.format(1)), GREEDY)
            healthy = engine.health.ok
    assert results == solo and after == solo[1] and errors and healthy
