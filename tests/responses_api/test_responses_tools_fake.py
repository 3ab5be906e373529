"""Responses API tool calling and reasoning over a FakeExecutor that generates scripted markup."""

from __future__ import annotations

import functools
import json

import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def call_markup(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def cfg(tool_parser="hermes", reasoning_parser="none"):
    overrides = [
        "server.port=0",
        "server.drain_timeout_s=5",
        f"model.tool_parser={tool_parser}",
        f"model.reasoning_parser={reasoning_parser}",
    ]
    return load_config(None, overrides=overrides, environ={})


#: Every request generates the text then EOS, a few tokens a step (1, 3, 2, cycled): the
#: markup is split anywhere.
server = functools.partial(fake_server, tokens_per_step=(1, 3, 2))


@pytest.mark.parametrize("stream", [False, True])
async def test_function_call_items(stream):
    reply = "Checking." + call_markup("get_weather", {"city": "Paris"})
    reply += call_markup("get_weather", {"city": "Rome"})
    kwargs = {"model": MODEL, "input": "Weather in Paris and Rome?", "tools": [WEATHER]}
    with trio.fail_after(20):
        async with server(cfg(), reply) as srv, openai_client(srv.url) as c:
            if stream:
                async with c.responses.stream(**kwargs) as s:
                    kinds = [event.type async for event in s]
                    response = await s.get_final_response()
                assert "response.function_call_arguments.delta" in kinds
                assert "response.function_call_arguments.done" in kinds
            else:
                response = await c.responses.create(**kwargs)
            single = await c.responses.create(**kwargs, parallel_tool_calls=False)
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert response.output_text == "Checking."
    calls = response.output[1:]
    assert [json.loads(call.arguments) for call in calls] == [{"city": "Paris"}, {"city": "Rome"}]
    assert all(call.name == "get_weather" and call.call_id and call.status == "completed" for call in calls)
    assert [item.type for item in single.output] == ["message", "function_call"]


async def test_function_call_arguments_stream_in_several_deltas():
    """A long call's ``arguments`` reach the SDK in several ``function_call_arguments.delta`` events, as generated,
    and add up to the item's final arguments."""
    arguments = {"city": "Paris, the capital of France, on the Seine, in the north of the country"}
    kwargs = {"model": MODEL, "input": "Weather in Paris?", "tools": [WEATHER]}
    with trio.fail_after(20):
        async with server(cfg(), call_markup("get_weather", arguments)) as srv, openai_client(srv.url) as c:
            async with c.responses.stream(**kwargs) as s:
                events = [event async for event in s]
                response = await s.get_final_response()
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 5
    assert "".join(deltas) == response.output[0].arguments
    assert json.loads(response.output[0].arguments) == arguments


async def test_function_call_output_round_trip_and_continuation():
    executors: list[FakeExecutor] = []
    with trio.fail_after(20):
        reply = call_markup("get_weather", {"city": "Paris"})
        async with server(cfg(), reply, executors=executors) as srv, openai_client(srv.url) as c:
            first = await c.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
            call = first.output[-1]
            second = await c.responses.create(
                model=MODEL,
                tools=[WEATHER],
                previous_response_id=first.id,
                input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"}],
            )
            stateless = await c.responses.create(
                model=MODEL,
                tools=[WEATHER],
                input=[
                    {"role": "user", "content": "Weather in Paris?"},
                    {"type": "reasoning", "id": "rs_1", "summary": []},
                    {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "call_9", "output": "Snow"},
                ],
            )
    tokenizer = FakeTokenizer()
    prompts = [tokenizer.decode(list(seq.prompt_token_ids)) for plan in executors[0].plans for seq in plan.new_seqs]
    assert "Sunny, 21C" in prompts[1] and "Paris" in prompts[1] and call.call_id
    # (the fake tokenizer's template renders no calls; the demo model's does: see the mlx tests)
    assert "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\nSnow" in prompts[2]
    assert second.output[-1].type == "function_call" and stateless.output[-1].type == "function_call"


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_item(stream):
    reply = "<think>Think first.</think>The answer."
    kwargs = {"model": MODEL, "input": "Q?", "reasoning": {"effort": "low"}}
    with trio.fail_after(20):
        async with server(cfg("none", "qwen3"), reply) as srv, openai_client(srv.url) as c:
            if stream:
                async with c.responses.stream(**kwargs) as s:
                    kinds = [event.type async for event in s]
                    response = await s.get_final_response()
                assert "response.reasoning_text.delta" in kinds
            else:
                response = await c.responses.create(**kwargs)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Think first." and response.output_text == "The answer."
    assert response.reasoning.effort == "low"
