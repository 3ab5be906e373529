"""The real HTTP server on 127.0.0.1 over a FakeExecutor: protocol shapes and bad input."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import fake_server
from vllm_mlx_trio.testing.polling import engine_idle, wait_until

MODEL = "demo:tiny"
CHAT = [{"role": "user", "content": "hi"}]


async def test_openai_chat_non_streaming(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv:
            async with openai_client(srv.url) as c:
                reply = await c.chat.completions.create(model=MODEL, messages=CHAT)
    assert reply.choices[0].message.content == "Hello, world!"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == len("Hello, world!") + 1  # + the EOS token
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"


async def test_openai_chat_streaming_with_usage(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv:
            async with openai_client(srv.url) as c:
                stream = await c.chat.completions.create(
                    model=MODEL, messages=CHAT, stream=True, stream_options={"include_usage": True}
                )
                chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Hello, world!"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 14
    assert len({c.id for c in chunks}) == 1


async def test_raw_sse_framing_ends_with_done(fake_cfg):
    body = {"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 5}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            async with http.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as resp:
                raw = (await resp.aread()).decode()
                headers = resp.headers
    assert headers["content-type"].startswith("text/event-stream")
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: ") :])
    assert last["choices"][0]["finish_reason"] == "length"


async def test_completions_endpoint_and_stop_strings(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv:
            async with openai_client(srv.url) as c:
                reply = await c.completions.create(model=MODEL, prompt="Say:", stop=[", w"])
                stream = await c.completions.create(model=MODEL, prompt="Say:", max_tokens=4, stream=True)
                streamed = [chunk async for chunk in stream]
    assert reply.choices[0].text == "Hello" and reply.choices[0].finish_reason == "stop"
    assert "".join(ch.choices[0].text for ch in streamed) == "Hell"
    assert streamed[-1].choices[0].finish_reason == "length"


async def test_models_and_health(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            models = (await http.get(f"{srv.url}/v1/models")).json()
            health = await http.get(f"{srv.url}/health")
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert health.status_code == 200 and health.json() == {"status": "ok"}


BAD_REQUESTS = [
    # (description, raw body or JSON value, expected status, expected param)
    ("invalid JSON", b'{"model": ', 400, None),
    ("trailing bytes", b'{"model": "demo:tiny", "messages": []} x', 400, None),
    ("array body", [1, 2], 400, None),
    ("null body", None, 400, None),
    ("invalid UTF-8", b'{"model": "\xff\xfe"}', 400, None),
    (
        "NaN literal",
        b'{"model": "demo:tiny", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
        400,
        None,
    ),
    ("unknown model", {"model": "gpt-9", "messages": CHAT}, 404, "model"),
    ("missing model", {"messages": CHAT}, 400, "model"),
    ("empty messages", {"model": MODEL, "messages": []}, 400, "messages"),
    ("roleless message", {"model": MODEL, "messages": [{"content": "x"}]}, 400, "messages[0].role"),
    (
        "image part",
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0]",
    ),
    ("temperature string", {"model": MODEL, "messages": CHAT, "temperature": "hot"}, 400, "temperature"),
    ("negative temperature", {"model": MODEL, "messages": CHAT, "temperature": -1}, 400, "temperature"),
    ("top_p 2", {"model": MODEL, "messages": CHAT, "top_p": 2}, 400, "top_p"),
    ("max_tokens 0", {"model": MODEL, "messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens bool", {"model": MODEL, "messages": CHAT, "max_tokens": True}, 400, "max_tokens"),
    ("max_tokens beyond context", {"model": MODEL, "messages": CHAT, "max_tokens": 10**9}, 400, "max_tokens"),
    ("n absurd", {"model": MODEL, "messages": CHAT, "n": 1000}, 400, "n"),
    ("unknown field", {"model": MODEL, "messages": CHAT, "frobnicate": 1}, 400, "frobnicate"),
    (
        "response_format without json_schema",
        {"model": MODEL, "messages": CHAT, "response_format": {"type": "json_schema"}},
        400,
        "response_format",
    ),
    ("not yet supported", {"model": MODEL, "messages": CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("stop list too long", {"model": MODEL, "messages": CHAT, "stop": ["x"] * 100}, 400, "stop"),
    ("stop wrong type", {"model": MODEL, "messages": CHAT, "stop": 5}, 400, "stop"),
    ("prompt on chat route", {"model": MODEL, "prompt": "x"}, 400, "prompt"),
]


@pytest.mark.parametrize(("what", "body", "status", "param"), BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS])
async def test_bad_input_gets_openai_shaped_error(fake_cfg, what, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            resp = await http.post(
                f"{srv.url}/v1/chat/completions", content=content, headers={"content-type": "application/json"}
            )
            async with openai_client(srv.url) as c:
                good = await c.chat.completions.create(model=MODEL, messages=CHAT)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert len(resp.content) < 4096
    assert good.choices[0].message.content == "Hello, world!"  # nothing else disturbed


async def test_oversized_body_and_unknown_route(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            big = await http.post(f"{srv.url}/v1/chat/completions", content=b"x" * (5 * 1024 * 1024))
            missing = await http.get(f"{srv.url}/v2/nothing")
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    assert missing.status_code == 404 and "error" in missing.json()


async def test_disconnect_mid_stream_frees_the_request(fake_cfg):
    body = {"model": MODEL, "messages": CHAT, "stream": True, "max_tokens": 4000}
    with trio.fail_after(20):
        async with fake_server(fake_cfg, text="abc", then_eos=False) as srv:
            async with httpx.AsyncClient() as http:
                async with http.stream("POST", f"{srv.url}/v1/chat/completions", json=body) as resp:
                    lines = resp.aiter_lines()
                    for _ in range(6):
                        await lines.__anext__()
            # the client has gone: within a few steps the engine holds nothing for it
            await wait_until(srv.engine.statistics, until=engine_idle, poll_s=0.01)
            stats = srv.engine.statistics()
    assert stats.scheduler.num_aborted == 1 and stats.cache.num_leased == 0
