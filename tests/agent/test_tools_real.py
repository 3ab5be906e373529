"""Tool calling on the real demo model (random weights, MLX on the CPU) through the openai
client and LangChain: forced calls (grammar) validate against the tool's schema."""

from __future__ import annotations

import json
from typing import Literal

import attrs
import jsonschema
import openai
import pytest
import trio
from agent_helpers import client, streamed_message

from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
TIMEOUT_S = 180
#: Bounded arguments: a random model fills an unbounded string until max_tokens.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
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
            "properties": {"zone": {"type": "string", "maxLength": 6}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_calls(calls) -> None:
    assert calls, "no tool call"
    for call in calls:
        schema = TOOLS[call.function.name]["function"]["parameters"]
        jsonschema.validate(json.loads(call.function.arguments), schema)


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
async def test_forced_calls_validate_and_stream_the_same(demo_cfg, tool_choice):
    request = {
        "model": MODEL,
        "messages": ASK,
        "tools": [WEATHER, TIME],
        "tool_choice": tool_choice,
        "max_tokens": 120,
        "temperature": 0,
    }
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, client(srv.url) as c:
            whole = await c.chat.completions.create(**request)
            stream = await c.chat.completions.create(**request, stream=True)
            chunks = [chunk async for chunk in stream]
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls)
    if isinstance(tool_choice, dict):
        assert [call.function.name for call in choice.message.tool_calls] == ["get_time"]
    streamed = streamed_message(chunks)
    assert streamed["finish"] == "tool_calls" and streamed["content"] == ""
    assert [(s["name"], s["arguments"]) for s in streamed["calls"]] == [
        (call.function.name, call.function.arguments) for call in choice.message.tool_calls
    ]


async def test_a_tool_call_loop(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, client(srv.url) as c:
            first = await c.chat.completions.create(
                model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=120, temperature=0
            )
            called = first.choices[0].message
            results = [
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})}
                for call in called.tool_calls
            ]
            history = [*ASK, called.model_dump(exclude_none=True), *results]
            second = await c.chat.completions.create(
                model=MODEL, messages=history, tools=[WEATHER], max_tokens=12, temperature=0
            )
            plain = await c.chat.completions.create(model=MODEL, messages=ASK, max_tokens=1)
            named = {"type": "function", "function": {"name": "get_weather"}}
            third = await c.chat.completions.create(
                model=MODEL, messages=history, tools=[WEATHER], tool_choice=named, max_tokens=120, temperature=0
            )
    # The tools went into the prompt (the template's system part), and so did the history.
    assert first.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    # The history (the call and its result) went into the prompt through the template.
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    check_calls(third.choices[0].message.tool_calls)


async def test_langchain_bind_tools_and_structured_output(demo_cfg):
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Forecast(BaseModel):
        city: Literal["Paris", "Rome", "Oslo"]
        days: int = Field(ge=1, le=7)

    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            llm = ChatOpenAI(
                model=MODEL, base_url=f"{srv.url}/v1", api_key="unused", temperature=0, max_tokens=120, max_retries=0
            )
            bound = llm.bind_tools([WEATHER], tool_choice="required")
            message = await trio.to_thread.run_sync(bound.invoke, "Weather in Paris?")
            structured = llm.with_structured_output(Forecast)
            forecast = await trio.to_thread.run_sync(structured.invoke, "Forecast for Rome?")
            by_tool = llm.with_structured_output(Forecast, method="function_calling")
            forecast_by_tool = await trio.to_thread.run_sync(by_tool.invoke, "Forecast for Oslo?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]
    jsonschema.validate(message.tool_calls[0]["args"], WEATHER["function"]["parameters"])
    assert isinstance(forecast, Forecast) and isinstance(forecast_by_tool, Forecast)


@pytest.mark.parametrize("tool_parser", ["none", "qwen3_coder", "glm45", "kimi_k2"])
async def test_forced_calls_on_any_tool_parser_and_on_none(demo_cfg, tool_parser):
    """Forced calls on a model with no tool parser, or one whose markup has no grammar, are
    generated as JSON calls under the grammar and come back as tool_calls; ``auto`` on a model
    with no parser stays a 400."""
    cfg = attrs.evolve(demo_cfg, model=attrs.evolve(demo_cfg.model, tool_parser=tool_parser))
    named = {"type": "function", "function": {"name": "get_weather"}}
    # bounded values only: a random model writes free text until max_tokens
    zone = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}
    time = {"type": "function", "function": {"name": "get_time", "parameters": zone}}
    request = {"model": MODEL, "messages": ASK, "tools": [WEATHER, time], "max_tokens": 120, "temperature": 0}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, client(srv.url) as c:
            required = await c.chat.completions.create(**request, tool_choice="required")
            stream = await c.chat.completions.create(**request, tool_choice=named, stream=True)
            chunks = [chunk async for chunk in stream]
            if tool_parser == "none":
                with pytest.raises(openai.BadRequestError) as caught:
                    await c.chat.completions.create(**request, tool_choice="auto")
                assert caught.value.body["param"] == "tools"
    assert required.choices[0].finish_reason == "tool_calls"
    check_calls(required.choices[0].message.tool_calls)
    streamed = streamed_message(chunks)
    assert streamed["finish"] == "tool_calls" and [s["name"] for s in streamed["calls"]] == ["get_weather"]
    jsonschema.validate(json.loads(streamed["calls"][0]["arguments"]), WEATHER["function"]["parameters"])
