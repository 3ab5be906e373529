"""Speculation through the whole engine on real demo models: stop strings, cancellation while a verify round is
running, the agreeing demo pair (acceptance, metrics, /v1/status) and a draft model with another tokenizer."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.runner_kinds import SPECULATIVE
from vllm_mlx_trio.worker.registry import with_runner

from .conftest import BlockingDrafter, spec_config
from .mtp_parts import generate

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
CHAT = [{"role": "user", "content": "Tell me about the sea and the ships."}]


async def text_and_tokens(engine, params, prompt=CHAT) -> tuple[str, list[int], str | None]:
    return await generate(engine, prompt, params)


async def test_stop_strings_cut_the_same_text_with_speculation(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(float32_dir, None)) as engine:
            reference, _, _ = await text_and_tokens(engine, GREEDY)
            stop = reference[len(reference) // 2 : len(reference) // 2 + 3]
            params = attrs.evolve(GREEDY, stop=(stop,))
            expected = await text_and_tokens(engine, params)
        async with open_engine(spec_config(float32_dir, float32_dir)) as engine:
            got = await text_and_tokens(engine, params)
            drafts = engine.metrics.spec_decode.num_drafts
    assert got == expected and expected[2] == "stop" and stop not in expected[0]
    assert drafts > 0


async def test_cancelling_while_a_round_runs_frees_the_sequence(float32_dir):
    from vllm_mlx_trio.worker.speculative.runner import SpecRunner

    made: list[BlockingDrafter] = []

    class BlockingSpecRunner(SpecRunner):
        def _load_drafter(self, info):
            made.append(BlockingDrafter(super()._load_drafter(info), block_at=3))
            return made[-1]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(float32_dir, None)) as engine:
            _, reference, _ = await text_and_tokens(engine, GREEDY)
        runners = with_runner(SPECULATIVE, BlockingSpecRunner)
        async with open_engine(spec_config(float32_dir, float32_dir), runners=runners) as engine:
            (drafter,) = made
            async with trio.open_nursery() as nursery:
                nursery.start_soon(text_and_tokens, engine, GREEDY)
                await trio.to_thread.run_sync(drafter.blocked.wait)  # the executor is inside a round now
                nursery.cancel_scope.cancel()
            drafter.release.set()
            await trio.to_thread.run_sync(drafter.stopped.wait)  # the runner let the sequence go
            _, again, _ = await text_and_tokens(engine, GREEDY)
            stats = engine.statistics()
    assert again == reference
    assert stats.num_requests == 0


async def test_the_demo_pair_agrees_and_reports_it(spec_pair):
    target, draft = spec_pair
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(target, None)) as engine:
            _, reference, _ = await text_and_tokens(engine, GREEDY)
        async with open_engine(spec_config(target, draft)) as engine:
            _, tokens, _ = await text_and_tokens(engine, GREEDY)
            counts = engine.metrics.spec_decode
            rendered = engine.metrics.render().decode()
    assert tokens == reference
    assert counts.num_drafts > 0 and counts.acceptance_rate > 0.8
    assert f'vllm:spec_decode_num_drafts_total{{model_name="{target}"}} {float(counts.num_drafts)}' in rendered
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in rendered and 'position="3"' in rendered


async def test_a_draft_model_with_another_tokenizer_is_refused_at_startup(float32_dir, spec_pair):
    _, draft = spec_pair  # 4096 tokens; the tiny model has 512
    refused = pytest.RaisesGroup(
        pytest.RaisesExc(ModelLoadError, match="its tokenizer differs"), flatten_subgroups=True
    )
    with trio.fail_after(TIMEOUT_S), refused:
        async with open_engine(spec_config(float32_dir, draft)):
            pass


async def test_a_prefix_cache_hit_speculates_with_the_same_tokens(float32_dir):
    long_chat = [{"role": "user", "content": "The sea, the ships and the harbour lights at night. " * 4}]
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(float32_dir, None)) as engine:
            _, reference, _ = await text_and_tokens(engine, GREEDY, long_chat)
        async with open_engine(spec_config(float32_dir, float32_dir, "cache.block_size=16")) as engine:
            _, first, _ = await text_and_tokens(engine, GREEDY, long_chat)
            drafts_first = engine.metrics.spec_decode.num_drafts
            with await engine.submit(long_chat, GREEDY) as stream:
                second = [t async for delta in stream for t in delta.token_ids]
            cached = stream.usage.cached_tokens
            drafts_second = engine.metrics.spec_decode.num_drafts - drafts_first
    assert first == second == reference
    assert cached >= 16 and drafts_first > 0 and drafts_second > 0
