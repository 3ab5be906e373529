"""The prefix cache on eight architectures (tests/prefix/prefix_zoo.py): with the cache on,
greedy tokens and logprobs equal the cache off, for exact repeats, shared prefixes, a second
chat turn, block-aligned and unaligned prompts, alone and inside a batch, in both modes; and
every exact repeat reuses all but its last token, whatever the model's cache layers are."""

from __future__ import annotations

import importlib.resources

import attrs
import pytest
import trio
from prefix_zoo import ARCHITECTURES, WINDOW

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.requests import chat

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
BS = 16
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)
WORDS = importlib.resources.files("vllm_mlx_trio").joinpath("data/corpus.txt").read_text().split()
ALL_KV = {"llama", "qwen3", "qwen3_moe", "deepseek_v3"}  # a hit may end anywhere


def config(model_dir: str, mode: str, *overrides: str):
    return load_config(
        None,
        overrides=[f"model.path={model_dir}", f"engine.mode={mode}", f"cache.block_size={BS}", *overrides],
        environ={},
    )


def text(tok, num_tokens: int, offset: int) -> str:
    """A raw prompt of about ``num_tokens`` tokens of the corpus from word ``offset``."""
    words: list[str] = []
    for word in WORDS[offset:]:
        if len(tok.encode(" ".join([*words, word]))) > num_tokens:
            break
        words.append(word)
    return " ".join(words)


@attrs.frozen
class Out:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    prompt_tokens: int
    cached_tokens: int
    #: turn2 only: whether turn 1's answer re-tokenizes to the tokens it was generated as
    round_trip: bool = False


async def run(engine, prompt) -> Out:
    with await engine.submit(prompt, PARAMS) as stream:
        tokens, logprobs = [], []
        async for delta in stream:
            tokens.extend(delta.token_ids)
            logprobs.extend(lp.logprob for lp in delta.logprobs)
    return Out(tuple(tokens), tuple(logprobs), stream.usage.prompt_tokens, stream.usage.cached_tokens)


async def scenario(engine) -> dict[str, Out]:
    tok = engine.model_info.tokenizer
    system = text(tok, 40, 0)  # longer than the window and than two blocks
    unaligned, aligned = text(tok, 3 * BS + 5, 200), None
    out: dict[str, Out] = {}
    for key, prompt in [
        ("first", chat("What is the sea?", system=system)),
        ("repeat", chat("What is the sea?", system=system)),
        ("shared_system", chat("Why are the stars so far away from us?", system=system)),
        ("unaligned", unaligned),
        ("unaligned_repeat", unaligned),
        ("short", "The old town"),
        ("short_repeat", "The old town"),
    ]:
        out[key] = await run(engine, prompt)
    answer = tok.decode(out["first"].tokens)
    turn2 = [
        *chat("What is the sea?", system=system),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And the sky?"},
    ]
    out["turn2"] = await run(engine, turn2)
    ids = tok.apply_chat_template(turn2, add_generation_prompt=True, tokenize=False)
    first_ids = tok.apply_chat_template(
        chat("What is the sea?", system=system), add_generation_prompt=True, tokenize=False
    )
    seen = tok.encode(first_ids, add_special_tokens=False) + list(out["first"].tokens)
    round_trip = tok.encode(ids, add_special_tokens=False)[: len(seen)] == seen
    out["turn2"] = attrs.evolve(out["turn2"], round_trip=round_trip)
    ids = tok.encode(text(tok, 4 * BS + 3, 400))
    aligned = tok.decode(ids[: 4 * BS])
    out["aligned"] = await run(engine, aligned)
    out["aligned_repeat"] = await run(engine, aligned)
    # inside a batch: three repeats of the unaligned prompt and a new prompt at once
    batch = {
        "batch_repeat_0": unaligned,
        "batch_repeat_1": unaligned,
        "batch_repeat_2": unaligned,
        "batch_new": text(tok, 30, 600),
    }

    async def one(key, prompt):
        out[key] = await run(engine, prompt)

    async with trio.open_nursery() as nursery:
        for key, prompt in batch.items():
            nursery.start_soon(one, key, prompt)
    return out


@pytest.mark.parametrize("mode", ["batched", "simple"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
async def test_cache_on_equals_cache_off_and_repeats_reuse(zoo_dirs, arch, mode):
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(zoo_dirs[arch], mode, "cache.enabled=false")) as engine:
            off = await scenario(engine)
        async with open_engine(config(zoo_dirs[arch], mode)) as engine:
            on = await scenario(engine)
            engine._cache.check_invariants()
            num_tails = engine.statistics().cache.pool.num_tails
    for key in off:
        assert on[key].tokens == off[key].tokens, key
        assert on[key].logprobs == pytest.approx(off[key].logprobs, abs=1e-4), key
        assert off[key].cached_tokens == 0 and on[key].cached_tokens < on[key].prompt_tokens, key
    assert on["first"].prompt_tokens > WINDOW and on["unaligned"].prompt_tokens % BS != 0
    for key in ("repeat", "unaligned_repeat", "short_repeat", "aligned_repeat"):
        assert on[key].cached_tokens == on[key].prompt_tokens - 1, key  # all but the last token
    assert on["aligned"].prompt_tokens == 4 * BS
    # turn 2 reuses turn 1's prompt; and its answer too where the answer's text gives back its
    # tokens (the finished cache is checkpointed after the answer's last token)
    turn2, first = on["turn2"], on["first"]
    assert turn2.cached_tokens >= first.prompt_tokens - 1
    if turn2.round_trip:
        assert turn2.cached_tokens == first.prompt_tokens + len(first.tokens)
    assert all(on[f"batch_repeat_{i}"].cached_tokens == on["unaligned"].prompt_tokens - 1 for i in range(3))
    if arch in ALL_KV:  # a shared prefix ends anywhere; else only at a checkpoint
        assert on["shared_system"].cached_tokens > 2 * BS
    assert num_tails > 0
