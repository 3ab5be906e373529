"""A shared prefix on sliding-window and recurrent models: the prefill snapshots those layers
at block boundaries (``cache.state_snapshot_blocks``), so the same system prompt followed by a
different question reuses the prefix up to the last snapshot, and the answer is still exactly
the cache-off greedy output."""

from __future__ import annotations

import pytest
import trio
from test_every_layer_type import BS, config, run, text

from vllm_mlx_trio import open_engine
from vllm_mlx_trio.testing.requests import chat

pytestmark = pytest.mark.mlx

STATE_LAYER_ARCHS = ("gemma3_text", "gpt_oss", "qwen3_next", "lfm2")
TIMEOUT_S = 120


async def shared_prefix_scenario(engine) -> dict:
    tok = engine.model_info.tokenizer
    system = text(tok, 3 * BS + 7, 0)  # past the window, over three blocks
    out = {}
    for key, question in [("first", "What is the sea?"), ("second", "Why are the stars so far away from us?")]:
        out[key] = await run(engine, chat(question, system=system))
    # two at once sharing the system prompt with the first two, and with each other
    async with trio.open_nursery() as nursery:
        for key, question in [("batch_a", "Who built the old town?"), ("batch_b", "When does the river freeze?")]:

            async def one(key=key, question=question):
                out[key] = await run(engine, chat(question, system=system))

            nursery.start_soon(one)
    shared = tok.apply_chat_template(chat("x", system=system), add_generation_prompt=True, tokenize=True)
    other = tok.apply_chat_template(chat("y", system=system), add_generation_prompt=True, tokenize=True)
    out["common"] = next(i for i, (a, b) in enumerate(zip(shared, other, strict=False)) if a != b)
    return out


@pytest.mark.parametrize("mode", ["batched", "simple"])
@pytest.mark.parametrize("arch", STATE_LAYER_ARCHS)
async def test_a_shared_system_prompt_is_reused_up_to_a_snapshot(zoo_dirs, arch, mode):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(zoo_dirs[arch], mode, "cache.enabled=false")) as engine:
            off = await shared_prefix_scenario(engine)
        async with open_engine(config(zoo_dirs[arch], mode, "cache.state_snapshot_blocks=1")) as engine:
            on = await shared_prefix_scenario(engine)
            engine._cache.check_invariants()
    common = on["common"]
    for key in ("first", "second", "batch_a", "batch_b"):
        assert on[key].tokens == off[key].tokens, key
        assert on[key].logprobs == pytest.approx(off[key].logprobs, abs=1e-4), key
    assert on["first"].cached_tokens == 0
    for key in ("second", "batch_a", "batch_b"):  # the last boundary before the prompts part
        assert on[key].cached_tokens == common // BS * BS > 0, (key, common)


async def test_without_snapshots_a_shared_prefix_reuses_nothing_on_a_recurrent_model(zoo_dirs):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(zoo_dirs["qwen3_next"], "batched", "cache.state_snapshot_blocks=0")) as engine:
            out = await shared_prefix_scenario(engine)
    assert out["second"].cached_tokens == 0
