"""Sampling and constrained decoding on the real trained demo:smollm2: a seed repeats its sample
(alone or sharing the batch), a JSON schema holds, and a forced tool call parses."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
import trio
from smollm2_helpers import FRANCE, MODEL, TIMEOUT_S, chat, post_chat, smollm2_config

from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = [pytest.mark.mlx, pytest.mark.smollm2]

FUN_FACT = "Tell me a fun fact."
SAMPLED = {"temperature": 0.8, "max_tokens": 24}


async def test_a_seeded_sample_repeats_alone_and_in_a_batch(smollm2_url, reference):
    greedy = reference.greedy(chat(FUN_FACT), max_tokens=24).text
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:

            async def sample(seed: int) -> str:
                reply = await post_chat(http, smollm2_url, chat(FUN_FACT), seed=seed, **SAMPLED)
                return reply["choices"][0]["message"]["content"]

            first, again = await sample(1), await sample(1)
            others = [await sample(seed) for seed in (2, 3)]
            batched: dict[str, str] = {}

            async def keep(key: str, seed: int) -> None:
                batched[key] = await sample(seed)

            async with trio.open_nursery() as nursery:  # seed 1 beside two other rows
                for key, seed in (("one", 1), ("two", 2), ("four", 4)):
                    nursery.start_soon(keep, key, seed)
    assert first and first == again
    assert batched["one"] == first and batched["two"] == others[0]  # each seed has its own PRNG key
    # it sampled: the three seeds do not all give the greedy reply (24 tokens at temperature 0.8)
    assert {first, *others} != {greedy}


#: A place, with free-form strings: a real model fills them with words, the grammar keeps the shape.
PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


async def test_a_json_schema_reply_validates(smollm2_url):
    response_format = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE, "strict": True}}
    question = chat(f"{FRANCE} Answer in JSON with the city and the country.")
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            reply = await post_chat(http, smollm2_url, question, response_format=response_format)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    jsonschema.validate(json.loads(choice["message"]["content"]), PLACE)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string"}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


async def test_a_named_tool_choice_forces_a_call_that_fits_its_schema(demo_cache_dir):
    """SmolLM2's template knows no tools, so the server reads none by itself ("auto" finds no
    parser): with the hermes parser set, a named tool_choice makes the grammar write the call."""
    cfg = smollm2_config(demo_cache_dir, "model.tool_parser=hermes")
    named = {"type": "function", "function": {"name": "get_weather"}}
    request = {
        "model": MODEL,
        "messages": chat("What is the weather in Paris?"),
        "tools": [WEATHER, TIME],
        "tool_choice": named,
        "max_tokens": 48,  # the call's markup and JSON take 38 tokens
        "temperature": 0,
    }
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as client:
            reply = await client.chat.completions.create(**request)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert [call.function.name for call in choice.message.tool_calls] == ["get_weather"]
    arguments = json.loads(choice.message.tool_calls[0].function.arguments)
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])
