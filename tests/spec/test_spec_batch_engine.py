"""Batched speculation through the whole engine on the float32 tiny model (the draft is the target itself): several
requests at once, some speculating, some on the normal path (a seeded sampled one, one asking for logprobs, one with a
penalty), all sharing the batch; outputs, logprobs and prefix-cache hits compared with speculation off."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine

from .conftest import spec_config

pytestmark = pytest.mark.mlx

TIMEOUT_S = 240
GREEDY = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
SHARED = "The sea, the ships and the harbour lights at night. " * 3
MIX = {
    "greedy-a": GREEDY,
    "greedy-b": attrs.evolve(GREEDY, max_tokens=21),
    "seeded": SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=28, ignore_eos=True),
    "logprobs": attrs.evolve(GREEDY, logprobs=2, max_tokens=18),
    "penalty": attrs.evolve(GREEDY, repetition_penalty=1.3, max_tokens=25),
}


def chat(name: str) -> list[dict]:
    return [{"role": "user", "content": f"{SHARED} Now {name}: tell me about it."}]


async def one(engine, name: str, params: SamplingParams, out: dict, before: dict | None = None) -> None:
    """``name``'s chat (with ``before``: its second turn, after the first turn's reply) -> (tokens, logprobs,
    cached_tokens, text) in ``out``."""
    messages = chat(name)
    if before is not None:
        messages = [*messages, {"role": "assistant", "content": before[name][3]}, {"role": "user", "content": "More."}]
    tokens, logprobs, text = [], [], ""
    with await engine.submit(messages, params) as stream:
        async for delta in stream:
            tokens.extend(delta.token_ids)
            text += delta.text
            logprobs.extend((entry.token_id, round(entry.logprob, 4)) for entry in delta.logprobs)
    out[name] = (tokens, logprobs, stream.usage.cached_tokens, text)


async def all_at_once(engine, before: dict | None = None) -> dict:
    out: dict = {}
    async with trio.open_nursery() as nursery:
        for name, params in MIX.items():
            nursery.start_soon(one, engine, name, params, out, before)
    return out


async def twice(cfg) -> tuple[dict, dict, object]:
    """One request alone (its prompt's blocks cached), then the mix at once, then each request's second turn at
    once (its first turn's prompt and reply are cached: committed from the row that generated them)."""
    async with open_engine(cfg) as engine:
        await one(engine, "warm", GREEDY, {})
        first = await all_at_once(engine)
        second = await all_at_once(engine, first)
        return first, second, engine.metrics.spec_decode


async def test_a_mixed_batch_gives_the_same_outputs_logprobs_and_cache_hits_on_and_off(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        off = await twice(spec_config(float32_dir, None, "cache.block_size=16"))
        on = await twice(spec_config(float32_dir, float32_dir, "cache.block_size=16"))
    for name in MIX:  # tokens and logprobs of every request, both times
        assert on[0][name][:2] == off[0][name][:2] and on[1][name][:2] == off[1][name][:2], name
    # the second turn finds the first turn's prompt and reply, committed from the speculating row's cache (in the
    # first turn, which request's shared blocks commit first depends on timing, with speculation on or off alike)
    assert {name: on[1][name][2] for name in MIX} == {name: off[1][name][2] for name in MIX}
    assert all(on[1][name][2] >= on[0][name][2] + len(on[0][name][0]) for name in MIX)  # the reply's KV too
    counts = on[2]
    assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0


async def test_per_position_counts_add_up_with_several_rows(float32_dir):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(float32_dir, float32_dir)) as engine:
            greedy = {name: params for name, params in MIX.items() if name.startswith("greedy")}
            out: dict = {}
            async with trio.open_nursery() as nursery:
                for name, params in greedy.items():
                    nursery.start_soon(one, engine, name, params, out)
            counts = engine.metrics.spec_decode
            rendered = engine.metrics.render().decode()
    per_position = counts.accepted_per_position
    assert sum(per_position) == counts.num_accepted_tokens
    assert list(per_position) == sorted(per_position, reverse=True)  # a draft stands only if those before it do
    assert per_position[0] <= counts.num_drafts
    assert f'position="{len(per_position) - 1}"' in rendered
