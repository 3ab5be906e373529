"""The Messages API on the real demo model (MLX on the CPU), driven by the anthropic SDK."""

from __future__ import annotations

import json

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.testing.clients import anthropic_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
#: Long enough to fill whole prefix-cache blocks (64 tokens each by default).
LONG_RULES = " ".join(f"Rule {i}: answer briefly and never repeat yourself." for i in range(20))
SYSTEM = [{"type": "text", "text": LONG_RULES, "cache_control": {"type": "ephemeral"}}]
USER = [{"role": "user", "content": "What is 2+2?"}]
TIMEOUT_S = 180


async def test_create_stream_and_count_tokens_agree(demo_cfg):
    # temperature is not a keyword of the newest SDK: older clients send it, so does this test
    kwargs = {"model": MODEL, "max_tokens": 24, "system": SYSTEM, "messages": USER, "extra_body": {"temperature": 0}}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with anthropic_client(srv.url) as c:
                counted = await c.messages.count_tokens(model=MODEL, system=SYSTEM, messages=USER)
                whole = await c.messages.create(**kwargs)  # a cold cache: the first request
                async with c.messages.stream(**kwargs) as stream:
                    streamed_text = "".join([text async for text in stream.text_stream])
                    streamed = await stream.get_final_message()
    assert counted.input_tokens == whole.usage.input_tokens
    assert whole.usage.cache_read_input_tokens == 0
    # the same prompt again: read (mostly) from the prefix cache, the sum is still the prompt
    assert streamed.usage.cache_read_input_tokens > 0
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == counted.input_tokens
    assert whole.content and whole.content[0].text == streamed_text == streamed.content[0].text
    assert "\ufffd" not in streamed_text
    assert whole.stop_reason in ("end_turn", "max_tokens") and whole.stop_reason == streamed.stop_reason
    assert whole.usage.output_tokens == streamed.usage.output_tokens


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


async def test_forced_tool_use_and_tool_result_round_trip(demo_cfg):
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    forced = {"type": "tool", "name": "get_weather"}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with anthropic_client(srv.url) as c:
                message = await c.messages.create(
                    model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER], tool_choice=forced
                )
                async with c.messages.stream(
                    model=MODEL, max_tokens=200, messages=ask, tools=[WEATHER], tool_choice=forced
                ) as stream:
                    streamed = await stream.get_final_message()
                call = next(block for block in message.content if block.type == "tool_use")
                history = [
                    *ask,
                    {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny"}]},
                ]
                answer = await c.messages.create(model=MODEL, max_tokens=8, messages=history, tools=[WEATHER])
                counted = await c.messages.count_tokens(model=MODEL, messages=history, tools=[WEATHER])
                no_tools = await c.messages.count_tokens(model=MODEL, messages=history)
    # the grammar forces one call of the named tool whose input fits the schema
    assert call.name == "get_weather" and isinstance(call.input, dict) and isinstance(call.input["city"], str)
    assert set(call.input) == {"city"} and message.stop_reason == "tool_use"
    assert [b.type for b in streamed.content if b.type == "tool_use"] == ["tool_use"]
    assert streamed.stop_reason == "tool_use"
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == counted.input_tokens
    assert no_tools.input_tokens < counted.input_tokens  # the template renders the tools: they count


async def test_prefill_is_continued_as_the_chat_route_continues_it(demo_cfg):
    """A final assistant turn is continued (vLLM's ``continue_final_message``): the reply is
    what the chat route gives with that flag, and count_tokens counts the open prompt."""
    prefill = [*USER, {"role": "assistant", "content": "The answer is"}]
    chat_body = {
        "model": MODEL,
        "messages": prefill,
        "max_tokens": 12,
        "temperature": 0,
        "continue_final_message": True,
        "add_generation_prompt": False,
    }
    closed_body = {**chat_body, "continue_final_message": False, "add_generation_prompt": True}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with anthropic_client(srv.url) as c:
                message = await c.messages.create(
                    model=MODEL, max_tokens=12, messages=prefill, extra_body={"temperature": 0}
                )
                counted = await c.messages.count_tokens(model=MODEL, messages=prefill)
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                continued = (await http.post(f"{srv.url}/v1/chat/completions", json=chat_body)).json()
                closed = (await http.post(f"{srv.url}/v1/chat/completions", json=closed_body)).json()
    assert message.content[0].text == continued["choices"][0]["message"]["content"]
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == counted.input_tokens
    assert counted.input_tokens == continued["usage"]["prompt_tokens"]
    assert counted.input_tokens < closed["usage"]["prompt_tokens"]  # no end of turn, no assistant opening


BOOLEAN_ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}


async def test_output_config_format_constrains_the_reply_to_the_schema(demo_cfg):
    """The random demo model writes JSON only because the grammar makes it."""
    config = {"format": {"type": "json_schema", "schema": BOOLEAN_ANSWER}, "effort": "low"}
    kwargs = {"model": MODEL, "max_tokens": 40, "messages": USER, "extra_body": {"temperature": 0}}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            async with anthropic_client(srv.url) as c:
                message = await c.messages.create(**kwargs, output_config=config)
                async with c.messages.stream(**kwargs, output_config=config) as stream:
                    streamed = await stream.get_final_message()
                counted = await c.messages.count_tokens(model=MODEL, messages=USER, output_config=config)
    assert message.stop_reason == "end_turn"
    assert set(json.loads(message.content[0].text)) == {"ok"}
    assert streamed.content[0].text == message.content[0].text
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


@pytest.mark.parametrize("budgeted", [True, False])
async def test_thinking_budget_closes_the_block(demo_cfg, budgeted):
    """The random demo model never writes ``</think>``: with a budget the block is closed for it
    after ``budget_tokens`` and an answer follows; without one the reply is all thinking."""
    cfg = attrs.evolve(demo_cfg, model=attrs.evolve(demo_cfg.model, reasoning_parser="qwen3"))
    opened = [*USER, {"role": "assistant", "content": "<think>"}]  # the block is open: the model starts inside
    thinking = {"type": "enabled", "budget_tokens": 1024} if budgeted else None
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv:
            async with anthropic_client(srv.url) as c:
                message = await c.messages.create(
                    model=MODEL, max_tokens=1100, messages=opened, extra_body={"temperature": 0, "thinking": thinking}
                )
            tokenizer = srv.engine.model_info.tokenizer
    kinds = [block.type for block in message.content]
    if not budgeted:
        assert kinds == ["thinking"] and message.stop_reason == "max_tokens"
        return
    assert kinds[0] == "thinking" and "text" in kinds[1:], kinds
    thought = len(tokenizer.encode(message.content[0].thinking, add_special_tokens=False))
    assert abs(thought - 1024) <= 16  # the budget's tokens, re-tokenized
