"""Structured output over HTTP with the openai client, on the real demo model."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import trio

from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
CHAT = [{"role": "user", "content": "Pick a city."}]
TIMEOUT_S = 120
SCHEMA = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Paris"]}, "sunny": {"type": "boolean"}},
    "required": ["city", "sunny"],
    "additionalProperties": False,
}


def json_schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}


async def test_response_format_json_schema_streamed_and_not(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            args = dict(model=MODEL, messages=CHAT, max_tokens=120, temperature=1.0, seed=5)
            whole = await c.chat.completions.create(**args, response_format=json_schema_format(SCHEMA))
            stream = await c.chat.completions.create(**args, response_format=json_schema_format(SCHEMA), stream=True)
            streamed = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
            choice = await c.chat.completions.create(**args, extra_body={"guided_choice": ["left", "right"]})
            completion = await c.completions.create(
                model=MODEL,
                prompt="City:",
                max_tokens=120,
                seed=5,
                extra_body={"response_format": {"type": "json_object"}},
            )
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), SCHEMA)
    assert streamed == whole.choices[0].message.content
    assert choice.choices[0].message.content in ("left", "right")
    assert completion.choices[0].finish_reason == "length" or isinstance(json.loads(completion.choices[0].text), dict)


async def test_a_bad_schema_is_a_400_in_openais_error_shape(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, openai_client(srv.url) as c:
            with pytest.raises(openai.BadRequestError) as info:
                await c.chat.completions.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=8,
                    response_format=json_schema_format({"type": "object", "properties": {"x": {"type": "nope"}}}),
                )
            with pytest.raises(openai.BadRequestError) as two:
                await c.chat.completions.create(
                    model=MODEL,
                    messages=CHAT,
                    max_tokens=8,
                    response_format={"type": "json_object"},
                    extra_body={"guided_regex": "a+"},
                )
    error = info.value.body
    assert error["type"] == "invalid_request_error" and error["param"] == "response_format"
    assert "nope" in error["message"]
    assert two.value.body["param"] == "guided_regex" and "Only one output constraint" in two.value.body["message"]
