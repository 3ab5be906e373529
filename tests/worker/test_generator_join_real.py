"""Rows that join mlx-lm's decode batch directly (worker/batched/generator_join.py), on the real demo model:
an exact repeat starts without a prompt step of its own, and what it produces (tokens, logprobs,
the finish at max_tokens or a stop token, even one its prompt ends with) is what mlx-lm's own
prompt path gives."""

from __future__ import annotations

import pytest
import trio
from mlx_lm.generate import BatchGenerator

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
EOS = 2  # <|im_end|> in the demo tokenizer
EOS_TEXT = "<|im_end|>"

JOBS = {
    "greedy": ("The sea was calm and the boats", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)),
    "logprobs": ("Tell me about the river", SamplingParams(temperature=0.0, max_tokens=6, logprobs=2, ignore_eos=True)),
    "one": ("A single token answer", SamplingParams(temperature=0.0, max_tokens=1)),
    "ends_in_eos": (
        f"The last word of this prompt is the stop token {EOS_TEXT}",
        SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=False),
    ),
    "forced_stop": (
        "Stop after a few words",
        SamplingParams(temperature=0.0, max_tokens=30, logit_bias=((EOS, 100.0),), min_tokens=3),
    ),
    "stops_at_once": ("Say nothing at all", SamplingParams(temperature=0.0, max_tokens=30, logit_bias=((EOS, 100.0),))),
}


async def outputs_of(model_dir: str, *overrides: str, repeat: bool) -> dict[str, list]:
    """Each job's deltas, all jobs at once on one engine; ``repeat``: each prompt is sent once
    first, so these are exact repeats (a hit that leaves only the last prompt token)."""
    cfg = load_config(None, overrides=[f"model.path={model_dir}", "cache.block_size=16", *overrides], environ={})
    results: dict[str, list] = {}

    async def one(key: str) -> None:
        prompt, params = JOBS[key]
        results[key] = [delta async for delta in engine.generate(prompt, params)]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            encoded = engine.model_info.tokenizer.encode(JOBS["ends_in_eos"][0])
            assert encoded[-1] == EOS  # the case is what it says
            if repeat:
                for key in JOBS:
                    await one(key)
            hits = engine.statistics().cache.num_hits
            async with trio.open_nursery() as nursery:
                for key in JOBS:
                    nursery.start_soon(one, key)
            assert engine.statistics().cache.num_hits - hits == (len(JOBS) if repeat else 0)
    return results


def tokens(deltas: list) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


async def test_a_joined_row_gives_what_mlx_lms_prompt_path_gives(float32_dir, monkeypatch):
    # mlx-lm's own path: no prefix cache and BatchGenerator prefilling every prompt
    reference = await outputs_of(float32_dir, "cache.enabled=false", "engine.prefill_time_ratio=none", repeat=False)
    inserted: list[int] = []
    insert_segments = BatchGenerator.insert_segments

    def spy(self, segments, *args, **kwargs):
        inserted.append(len(segments))
        return insert_segments(self, segments, *args, **kwargs)

    monkeypatch.setattr(BatchGenerator, "insert_segments", spy)
    joined = await outputs_of(float32_dir, "engine.run_ahead_steps=1", repeat=True)
    assert inserted == []  # every prompt (the first sends' prefilled ones, then the repeats) joined directly
    for key in JOBS:
        assert tokens(joined[key]) == tokens(reference[key]), key
        assert joined[key][-1].finish_reason == reference[key][-1].finish_reason, key
    logprobs = [[lp for d in deltas["logprobs"] for lp in d.logprobs] for deltas in (joined, reference)]
    assert logprobs[0] == logprobs[1] and len(logprobs[0]) == 6
    assert len(tokens(joined["one"])) == 1
    assert tokens(joined["forced_stop"])[-1] == EOS and len(tokens(joined["forced_stop"])) == 4
    # the first token, emitted the step it was sampled, ends the request: the generator's row goes with it
    assert tokens(joined["stops_at_once"]) == [EOS] and joined["stops_at_once"][-1].finish_reason == "stop"
