"""Constrained decoding on the real demo model, in both runners: outputs match their schema
(or end with ``length``), forced tool calls parse, and a constrained row leaves its greedy
neighbours' tokens exactly as they are without it."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.constraint import ConstraintSpec, canonical_json
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.testing.requests import chat

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Oslo", "Paris", "Lima"]},
        "rain": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["city", "rain", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Oslo", "Paris"]}, "metric": {"type": "boolean"}},
            "required": ["city", "metric"],
            "additionalProperties": False,
        },
    },
}
PING = {
    "type": "function",
    "function": {"name": "ping", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
}
HERMES_CALL = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


def config(model: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model}", *overrides], environ={})


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "Describe the weather in city number {}."


async def generate(engine, prompt, params) -> tuple[str, list[int], str | None]:
    text, tokens, finish = [], [], None
    async for delta in engine.generate(prompt, params):
        text.append(delta.text)
        tokens.extend(delta.token_ids)
        finish = delta.finish_reason or finish
    return "".join(text), tokens, finish


async def run_all(engine, jobs: dict) -> dict:
    results = {}

    async def one(key, prompt, params):
        results[key] = await generate(engine, prompt, params)

    async with trio.open_nursery() as nursery:
        for key, (prompt, params) in jobs.items():
            nursery.start_soon(one, key, prompt, params)
    return results


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_json_schema_outputs_validate_or_end_with_length(demo_cache_dir, mode):
    constraint = ConstraintSpec(kind="json_schema", body=canonical_json(SCHEMA))
    jobs = {
        seed: (
            chat(QUESTION.format(seed)),
            SamplingParams(temperature=1.0, seed=seed, max_tokens=48, constraint=constraint),
        )
        for seed in range(4)
    }
    with trio.fail_after(TIMEOUT_S):
        cfg = config("demo:tiny", f"engine.mode={mode}", f"model.demo_cache_dir={demo_cache_dir}")
        async with open_engine(cfg) as engine:
            results = await run_all(engine, jobs)
    stopped = 0
    for text, _tokens, finish in results.values():
        if finish == "length":
            continue
        assert finish == "stop"
        jsonschema.validate(json.loads(text), SCHEMA)
        stopped += 1
    assert stopped >= 1  # the schema is small: most rows finish it well within 48 tokens


async def test_a_constrained_row_leaves_its_greedy_neighbours_unchanged(float32_dir):
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    neighbours = {i: (chat(QUESTION.format(i)), greedy) for i in range(3)}
    constrained = SamplingParams(
        temperature=1.0, seed=3, max_tokens=24, constraint=ConstraintSpec(kind="json_object", body="")
    )
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, "engine.mode=batched")) as engine:
            without = await run_all(engine, neighbours)
            with_row = await run_all(engine, {**neighbours, "json": (chat(QUESTION.format(9)), constrained)})
    assert {i: with_row[i][1] for i in neighbours} == {i: without[i][1] for i in neighbours}
    assert with_row["json"][0].startswith("{")


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_forced_tool_calls_parse_as_hermes_calls_whose_arguments_validate(float32_dir, mode):
    tools = {"get_weather": WEATHER, "ping": PING}
    required = ConstraintSpec(kind="tool_calls", body=json.dumps([WEATHER, PING]), tool_call_format="hermes")
    named = ConstraintSpec(kind="tool_calls", body=json.dumps([WEATHER]), tool_call_format="hermes", parallel=False)
    jobs = {
        "required": (
            chat(QUESTION.format(1)),
            SamplingParams(temperature=1.0, seed=1, max_tokens=256, constraint=required),
        ),
        "named": (chat(QUESTION.format(2)), SamplingParams(temperature=1.0, seed=2, max_tokens=256, constraint=named)),
    }
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(float32_dir, f"engine.mode={mode}")) as engine:
            results = await run_all(engine, jobs)
    for key, (text, _tokens, finish) in results.items():
        assert finish == "stop", (key, text)
        calls = [json.loads(body) for body in HERMES_CALL.findall(text)]
        assert calls and text == "\n".join(f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls)
        for call in calls:
            parameters = tools[call["name"]]["function"]["parameters"]
            jsonschema.validate(call["arguments"], parameters)
    assert [c["name"] for c in map(json.loads, HERMES_CALL.findall(results["named"][0]))] == ["get_weather"]


async def test_an_invalid_schema_is_refused_at_admission(demo_cache_dir):
    bad = ConstraintSpec(kind="json_schema", body='{"type":"no-such-type"}')
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config("demo:tiny", f"model.demo_cache_dir={demo_cache_dir}")) as engine:
            with pytest.raises(InvalidRequestError, match="no-such-type"):
                await generate(engine, chat(QUESTION.format(0)), SamplingParams(max_tokens=4, constraint=bad))
