"""The Responses API on the real demo model (MLX on the CPU), driven by the openai SDK."""

from __future__ import annotations

import json
import re

import pytest
import trio

from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
TIMEOUT_S = 180


async def test_create_stream_and_continue(demo_cfg):
    rules = " ".join(f"Rule {i}: answer briefly and never repeat yourself." for i in range(20))  # > 1 cache block
    kwargs = {"model": MODEL, "input": "What is 2+2?", "instructions": rules, "temperature": 0, "max_output_tokens": 24}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with openai_client(srv.url) as c:
                whole = await c.responses.create(**kwargs)
                # The random demo model runs to max_output_tokens: the stream ends with
                # response.incomplete (as OpenAI's does), which the SDK's get_final_response()
                # does not take; the event carries the final response.
                async with c.responses.stream(**kwargs) as stream:
                    ends = [e async for e in stream if e.type in ("response.completed", "response.incomplete")]
                streamed = ends[-1].response
                follow = await c.responses.create(
                    model=MODEL, input="And 3+3?", previous_response_id=whole.id, max_output_tokens=8, temperature=0
                )
                alone = await c.responses.create(model=MODEL, input="And 3+3?", max_output_tokens=1)
    assert whole.output_text and whole.output_text == streamed.output_text
    assert whole.status == streamed.status and whole.status in ("completed", "incomplete")
    assert whole.usage.input_tokens_details.cached_tokens == 0
    assert 0 < streamed.usage.input_tokens_details.cached_tokens <= streamed.usage.input_tokens
    # the follow-up's prompt holds the first exchange (question and answer; not its instructions)
    assert follow.usage.input_tokens >= alone.usage.input_tokens + whole.usage.output_tokens
    assert follow.usage.input_tokens < whole.usage.input_tokens
    assert follow.previous_response_id == whole.id and follow.output_text


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}


async def test_forced_function_call_and_json_schema_output(demo_cfg):
    forced = {"type": "function", "name": "get_weather"}
    json_format = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with openai_client(srv.url) as c:
                called = await c.responses.create(
                    model=MODEL, input="Weather in Paris?", tools=[WEATHER], tool_choice=forced, max_output_tokens=200
                )
                async with c.responses.stream(
                    model=MODEL, input="What is 2+2?", text=json_format, max_output_tokens=200
                ) as stream:
                    events = [event async for event in stream]
    [call] = [item for item in called.output if item.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    # The random model may wander inside the JSON until the token limit: then the response is
    # incomplete (the client knows the JSON is cut), else the JSON validates.
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    structured = last.response
    assert structured.text.format.type == "json_schema"
    if last.type == "response.incomplete":
        assert structured.incomplete_details.reason == "max_output_tokens"
    else:
        assert isinstance(json.loads(structured.output_text)["answer"], int)


async def test_forced_custom_tool_reply_is_its_input_held_to_its_lark_grammar(demo_cfg):
    lark = 'start: "*** Begin Patch\\n" /[a-z]{1,12}/ "\\n*** End Patch"\n'
    patch = {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "syntax": "lark", "definition": lark},
    }
    forced = {"type": "custom", "name": "apply_patch"}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with openai_client(srv.url) as c:
                response = await c.responses.create(
                    model=MODEL, input="Fix it.", tools=[patch], tool_choice=forced, max_output_tokens=60
                )
    [call] = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert re.fullmatch(r"\*\*\* Begin Patch\n[a-z]{1,12}\n\*\*\* End Patch", call.input)
