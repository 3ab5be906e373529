"""Tool calls parsed from scripted output (FakeExecutor), over HTTP with the openai client."""

from __future__ import annotations

import json

import trio
from agent_helpers import MODEL, TIME, WEATHER, client, hermes_call, parser_cfg, scripted_server, streamed_message

TIMEOUT_S = 30
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = hermes_call("get_weather", {"city": "Paris", "days": 2})
TWO_CALLS = "Let me check." + CALL + "\n" + hermes_call("get_time", {"zone": "CET"})


async def ask(text, cfg=None, **request):
    cfg = cfg or parser_cfg()
    request = {"model": MODEL, "messages": ASK, "tools": [WEATHER, TIME], **request}
    async with scripted_server(cfg, text) as srv, client(srv.url) as c:
        whole = await c.chat.completions.create(**request)
        stream = await c.chat.completions.create(**request, stream=True)
        chunks = [chunk async for chunk in stream]
    return whole, chunks


async def test_a_call_is_parsed_whole_and_streamed_the_same():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(TWO_CALLS)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content == "Let me check."
    calls = message.tool_calls
    assert [(c.type, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("function", "get_weather", {"city": "Paris", "days": 2}),
        ("function", "get_time", {"zone": "CET"}),
    ]
    assert all(c.id.startswith("call_") for c in calls) and calls[0].id != calls[1].id
    streamed = streamed_message(chunks)
    assert streamed["finish"] == "tool_calls"
    assert streamed["content"] == "Let me check."  # no markup leaks into the content
    assert [(s["name"], s["arguments"], s["firsts"]) for s in streamed["calls"]] == [
        (c.function.name, c.function.arguments, 1) for c in calls
    ]  # each call: its own index, id once, fragments concatenating to the same JSON


async def test_only_a_call_gives_null_content():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(CALL)
    assert whole.choices[0].message.content is None
    assert len(whole.choices[0].message.tool_calls) == 1
    assert streamed_message(chunks)["content"] == ""


async def test_tool_choice_none_leaves_the_markup_as_content():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(CALL, tool_choice="none")
    assert whole.choices[0].message.content == CALL
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "stop"
    assert streamed_message(chunks) == {"content": CALL, "reasoning": "", "calls": [], "finish": "stop"}


async def test_parallel_tool_calls_false_returns_the_first_call_only():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(TWO_CALLS, parallel_tool_calls=False)
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["get_weather"]
    assert [c["name"] for c in streamed_message(chunks)["calls"]] == ["get_weather"]


async def test_without_tools_the_markup_is_plain_content():
    with trio.fail_after(TIMEOUT_S):
        async with scripted_server(parser_cfg(), CALL) as srv, client(srv.url) as c:
            reply = await c.chat.completions.create(model=MODEL, messages=ASK)
    assert reply.choices[0].message.content == CALL and reply.choices[0].finish_reason == "stop"


async def test_a_call_cut_by_max_tokens_finishes_length():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(CALL, max_tokens=len("<tool_call>\n{") + 3)
    assert whole.choices[0].finish_reason == "length"
    assert streamed_message(chunks)["finish"] == "length"


async def test_completions_never_parse_calls():
    with trio.fail_after(TIMEOUT_S):
        async with scripted_server(parser_cfg(), CALL) as srv, client(srv.url) as c:
            reply = await c.completions.create(model=MODEL, prompt="p")
    assert reply.choices[0].text == CALL


async def test_every_choice_has_its_own_parser():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await ask(TWO_CALLS, n=2)
    for choice in whole.choices:
        assert [c.function.name for c in choice.message.tool_calls] == ["get_weather", "get_time"]
    for index in (0, 1):
        mine = [ch for ch in chunks if ch.choices and ch.choices[0].index == index]
        assert [c["name"] for c in streamed_message(mine)["calls"]] == ["get_weather", "get_time"]
