"""Messages API tool use and thinking over a FakeExecutor that generates scripted markup.

The model's "reply" is Qwen/Hermes markup (``<tool_call>...</tool_call>``, ``<think>...</think>``)
produced a few tokens per step, so markup is split anywhere; the anthropic SDK must see
``tool_use`` blocks (streamed as ``input_json_delta`` fragments), ``thinking`` blocks and
``stop_reason: tool_use``, the same streamed and not.
"""

from __future__ import annotations

import functools
import json

import anthropic
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import anthropic_client
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "cache_control": {"type": "ephemeral"},
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


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
async def test_tool_use_blocks(stream):
    reply = "Let me check." + call_markup("get_weather", {"city": "Paris"})
    kwargs = {"model": MODEL, "max_tokens": 200, "messages": ASK, "tools": [WEATHER]}
    with trio.fail_after(20):
        async with server(cfg(), reply) as srv, anthropic_client(srv.url) as c:
            if stream:
                async with c.messages.stream(**kwargs) as s:
                    message = await s.get_final_message()
            else:
                message = await c.messages.create(**kwargs)
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[0].text == "Let me check."
    call = message.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris"} and call.id
    assert message.stop_reason == "tool_use"


async def test_arguments_stream_as_input_json_delta():
    """A long call's arguments reach the SDK in several ``input_json_delta`` fragments, as generated (the
    scripted model writes a few characters a step), and add up to the final ``input``."""
    arguments = {"city": "Paris, the capital of France, on the Seine, in the north of the country"}
    reply = call_markup("get_weather", arguments)
    kwargs = {"model": MODEL, "max_tokens": 400, "messages": ASK, "tools": [WEATHER]}
    with trio.fail_after(20):
        async with server(cfg(), reply) as srv, anthropic_client(srv.url) as c, c.messages.stream(**kwargs) as s:
            events = [event async for event in s]
            message = await s.get_final_message()
    fragments = [
        e.delta.partial_json for e in events if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
    ]
    assert len(fragments) > 5
    assert json.loads("".join(fragments)) == arguments == message.content[0].input
    start = next(e for e in events if e.type == "content_block_start")
    assert start.content_block.type == "tool_use" and start.content_block.input == {}
    # The first fragment goes out before the last of the call's text was generated.
    assert events.index(next(e for e in events if e.type == "content_block_delta")) < len(events) - 5


async def test_disable_parallel_tool_use_keeps_the_first_call():
    reply = call_markup("get_weather", {"city": "Paris"}) + call_markup("get_weather", {"city": "Rome"})
    with trio.fail_after(20):
        async with server(cfg(), reply) as srv, anthropic_client(srv.url) as c:
            both = await c.messages.create(model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER])
            one = await c.messages.create(
                model=MODEL,
                max_tokens=200,
                messages=ASK,
                tools=[WEATHER],
                tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            )
    assert [b.input["city"] for b in both.content if b.type == "tool_use"] == ["Paris", "Rome"]
    assert [b.input["city"] for b in one.content if b.type == "tool_use"] == ["Paris"]


async def test_tool_choice_none_renders_tools_but_parses_no_call():
    reply = call_markup("get_weather", {"city": "Paris"})
    with trio.fail_after(20):
        async with server(cfg(), reply) as srv, anthropic_client(srv.url) as c:
            message = await c.messages.create(
                model=MODEL, max_tokens=200, messages=ASK, tools=[WEATHER], tool_choice={"type": "none"}
            )
    assert [b.type for b in message.content] == ["text"] and message.stop_reason == "end_turn"


async def test_tool_result_round_trip_reaches_the_prompt():
    executors: list[FakeExecutor] = []
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "", "signature": ""},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "Sunny, 21C"}]},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    with trio.fail_after(20):
        async with server(cfg(), "It is sunny.", executors=executors) as srv, anthropic_client(srv.url) as c:
            message = await c.messages.create(model=MODEL, max_tokens=50, messages=history, tools=[WEATHER])
            counted = await c.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
    [seq] = [seq for plan in executors[0].plans for seq in plan.new_seqs]
    prompt = FakeTokenizer().decode(list(seq.prompt_token_ids))
    assert "Sunny, 21C" in prompt and "And tomorrow?" in prompt and "Paris" in prompt
    assert message.content[0].text == "It is sunny." and message.stop_reason == "end_turn"
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_becomes_a_thinking_block(stream):
    reply = "<think>The user wants weather.</think>It is sunny."
    thinking = {"type": "enabled", "budget_tokens": 1024}
    kwargs = {"model": MODEL, "max_tokens": 2000, "messages": ASK, "thinking": thinking}
    with trio.fail_after(20):
        async with server(cfg("none", "qwen3"), reply) as srv, anthropic_client(srv.url) as c:
            if stream:
                async with c.messages.stream(**kwargs) as s:
                    kinds = [event.type async for event in s]
                    message = await s.get_final_message()
                assert "thinking" in kinds and "signature" in kinds
            else:
                message = await c.messages.create(**kwargs)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "The user wants weather." and message.content[0].signature == ""
    assert message.content[1].text == "It is sunny."


BAD = [
    ({"tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
    ({"tool_choice": {"type": "any"}, "tools": []}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "budget_tokens"),
    ({"tools": [WEATHER, WEATHER]}, "unique"),
    (
        {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {}}]}]},
        "not allowed in user messages",
    ),
    (
        {"tool_choice": {"type": "any"}, "output_config": {"format": {"type": "json_schema", "schema": {}}}},
        "cannot be combined with forced tool use",
    ),
]


@pytest.mark.parametrize(("change", "needle"), BAD)
async def test_bad_tool_requests(change, needle):
    with trio.fail_after(20):
        async with server(cfg(), "x") as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await c.messages.create(
                    model=MODEL, max_tokens=2000, messages=ASK, extra_body={"tools": [WEATHER], **change}
                )
    assert needle in caught.value.body["error"]["message"]


async def test_tools_need_a_tool_parser():
    with trio.fail_after(20):
        async with server(cfg("none"), "x") as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await c.messages.create(model=MODEL, max_tokens=20, messages=ASK, tools=[WEATHER])
    assert "no tool parser" in caught.value.body["error"]["message"]
