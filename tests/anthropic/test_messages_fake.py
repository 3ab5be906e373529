"""Anthropic Messages API on the real HTTP server over a FakeExecutor: protocol details.

The anthropic SDK is the client wherever it can be (it is what must parse our answers);
raw httpx where the bytes on the wire are the point (``event:`` lines, ``ping``).
"""

from __future__ import annotations

import json

import anthropic
import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.config import API_KEYS_ENV
from vllm_mlx_trio.errors import ExecutorCrashedError
from vllm_mlx_trio.http.anthropic import routes as anthropic_routes
from vllm_mlx_trio.http.auth import INVALID_KEY_MESSAGE, MISSING_KEY_MESSAGE, ApiKeys
from vllm_mlx_trio.testing.clients import anthropic_client
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import fake_server
from vllm_mlx_trio.testing.polling import engine_idle, wait_until

MODEL = "demo:tiny"
USER = [{"role": "user", "content": "hi"}]
KEY = "sk-test-anthropic-key-0123456789"


def sse_events(raw: str) -> list[tuple[str | None, dict | None]]:
    """(event name, data) for each SSE event; comments and data-less events give None data."""
    events = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name = data = None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data = json.loads(line[len("data: ") :])
        events.append((name, data))
    return events


async def test_create_returns_a_message_with_usage_equal_to_count_tokens(fake_cfg):
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c:
            message = await c.messages.create(model=MODEL, max_tokens=100, messages=USER, system=system)
            counted = await c.messages.count_tokens(model=MODEL, messages=USER, system=system)
            without_system = await c.messages.count_tokens(model=MODEL, messages=USER)
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    assert [(b.type, b.text) for b in message.content] == [("text", "Hello, world!")]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == len("Hello, world!") + 1  # + the EOS token
    # a cold cache: the whole prompt is input_tokens, and that is what count_tokens says
    assert message.usage.cache_read_input_tokens == 0
    assert counted.input_tokens == message.usage.input_tokens
    assert without_system.input_tokens < counted.input_tokens


async def test_count_tokens_accepts_beta_query(fake_cfg):
    body = {"model": MODEL, "messages": USER}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            plain = await http.post(f"{srv.url}/v1/messages/count_tokens", json=body)
            beta = await http.post(f"{srv.url}/v1/messages/count_tokens?beta=true", json=body)
    assert plain.status_code == beta.status_code == 200
    assert plain.json() == beta.json() and plain.json()["input_tokens"] > 0


async def test_stream_helper_final_message_matches_the_text(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c:
            async with c.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
                texts = [text async for text in stream.text_stream]
                final = await stream.get_final_message()
    assert "".join(texts) == "Hello, world!"
    assert final.content[0].text == "Hello, world!" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == len("Hello, world!") + 1
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > 0


async def test_stream_event_protocol_on_the_wire(fake_cfg):
    body = {"model": MODEL, "max_tokens": 3, "messages": USER, "stream": True}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            resp = await http.post(f"{srv.url}/v1/messages", json=body)
    assert resp.headers["content-type"].startswith("text/event-stream")
    events = sse_events(resp.text)
    assert all(name == data["type"] for name, data in events)  # every event has its event: line
    names = [name for name, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 3,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["usage"]["output_tokens"] == 0 and start["usage"]["input_tokens"] > 0
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 3


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_sequence_is_reported(fake_cfg, stream):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c:
            kwargs = {"model": MODEL, "max_tokens": 100, "messages": USER, "stop_sequences": ["zz", ", w"]}
            if stream:
                async with c.messages.stream(**kwargs) as s:
                    message = await s.get_final_message()
            else:
                message = await c.messages.create(**kwargs)
    assert message.content[0].text == "Hello"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", ", w")


async def test_claude_code_style_request_is_accepted(fake_cfg):
    """System blocks and messages with cache_control, thinking blocks with empty signatures in
    history, metadata and service_tier: bookkeeping, accepted and ignored."""
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "system": [
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral", "ttl": "1h"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "The user greets me.", "signature": ""},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Hello."},
                ],
            },
            {"role": "user", "content": "again"},
        ],
        "metadata": {"user_id": "user_abc"},
        "service_tier": "auto",
        "temperature": 0,
        "top_k": 5,
        "top_p": 0.9,
        "tool_choice": {"type": "none"},
        "thinking": {"type": "disabled"},
    }
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            resp = await http.post(f"{srv.url}/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"][0]["text"] == "Hello, world!"


BAD = [
    ("unknown field", {"foo": 1}, "foo: Extra inputs are not permitted"),
    (
        "unknown block field",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "y": 1}]}]},
        "messages.0.content.0.y: Extra inputs are not permitted",
    ),
    ("max_tokens missing", {"max_tokens": None}, "max_tokens"),
    ("wrong type", {"temperature": "hot"}, "temperature"),
    ("bad role", {"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ("no messages", {"messages": []}, "messages"),
    (
        "prefill ending in whitespace",
        {"messages": [*USER, {"role": "assistant", "content": "Sure "}]},
        "trailing whitespace",
    ),
    (
        "prefill with a tool call",
        {
            "messages": [
                *USER,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            ]
        },
        "cannot hold tool_use",
    ),
    ("mcp_servers", {"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
    ("container", {"container": "c1"}, "container"),
    ("server tool", {"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
    ("document", {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, "'document'"),
    (
        "citations",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "x", "citations": [{}]}]}]},
        "citations",
    ),
    ("temperature range", {"temperature": 7}, "temperature"),
    (
        "image on a text-only model",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/a.png"}}]}
            ]
        },
        "not supported by this model",
    ),
    ("max_tokens range", {"max_tokens": 0}, "max_tokens"),
    (
        "image from the user on a text-only model",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                        }
                    ],
                }
            ]
        },
        "not supported by this model",
    ),
    ("effort beyond the templates' levels", {"output_config": {"effort": "max"}}, "output_config.effort"),
    ("output format not a schema", {"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
]


@pytest.mark.parametrize(("what", "change", "needle"), BAD, ids=[b[0] for b in BAD])
async def test_bad_requests_get_anthropic_errors(fake_cfg, what, change, needle):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.BadRequestError) as caught:  # extra_body replaces fields as given
                await c.messages.create(model=MODEL, max_tokens=10, messages=USER, extra_body=change)
    error = caught.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert needle in error["error"]["message"]


async def test_unknown_model_and_path_are_not_found_errors(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c, httpx.AsyncClient() as http:
            with pytest.raises(anthropic.NotFoundError) as caught:
                await c.messages.create(model="claude-nope", max_tokens=5, messages=USER)
            path = await http.post(f"{srv.url}/v1/messages/nothing", json={})
            chat = await http.post(f"{srv.url}/v1/chat/completions", json={"model": "x", "messages": USER})
    assert caught.value.body["error"]["type"] == "not_found_error"
    assert path.status_code == 404 and path.json()["error"]["type"] == "not_found_error"
    assert chat.status_code == 404 and "code" in chat.json()["error"]  # other routes keep OpenAI's shape


async def test_x_api_key_and_bearer_both_authenticate(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    body = {"model": MODEL, "max_tokens": 5, "messages": USER}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            async with anthropic_client(srv.url, api_key=KEY) as c:  # the SDK sends x-api-key
                by_sdk = await c.messages.create(**body)
            bearer = await http.post(f"{srv.url}/v1/messages", json=body, headers={"Authorization": f"Bearer {KEY}"})
            x_api_key = await http.post(f"{srv.url}/v1/messages", json=body, headers={"x-api-key": KEY})
            on_chat = await http.get(f"{srv.url}/v1/models", headers={"x-api-key": KEY})
            async with anthropic_client(srv.url, api_key="sk-wrong") as c:
                with pytest.raises(anthropic.AuthenticationError) as caught:
                    await c.messages.create(**body)
            missing = await http.post(f"{srv.url}/v1/messages", json=body)
    assert by_sdk.content[0].text == "Hello"
    assert (bearer.status_code, x_api_key.status_code, on_chat.status_code) == (200, 200, 200)
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert missing.status_code == 401 and missing.json()["type"] == "error"
    assert KEY not in missing.text


async def test_full_engine_is_a_rate_limit_error(fake_cfg):
    cfg = attrs.evolve(
        fake_cfg,
        engine=attrs.evolve(fake_cfg.engine, max_num_seqs=1),
        limits=attrs.evolve(fake_cfg.limits, max_waiting=0),
    )
    gate = StepGate()
    body = {"model": MODEL, "max_tokens": 5, "messages": USER, "stream": True}
    with trio.fail_after(20):
        async with fake_server(cfg, gate=gate) as srv, anthropic_client(srv.url) as c, httpx.AsyncClient() as http:
            async with http.stream("POST", f"{srv.url}/v1/messages", json=body) as first:
                lines = first.aiter_lines()
                assert (await lines.__anext__()) == "event: message_start"
                with pytest.raises(anthropic.RateLimitError) as caught:
                    await c.messages.create(model=MODEL, max_tokens=5, messages=USER)
                gate.allow(100)
                rest = [line async for line in lines]
    assert "event: message_stop" in rest
    assert caught.value.status_code == 429 and caught.value.body["error"]["type"] == "rate_limit_error"


async def test_failure_mid_stream_is_an_error_event(fake_cfg):
    with trio.fail_after(20), pytest.raises(ExecutorCrashedError):  # the server exits with its engine
        async with fake_server(fake_cfg, fail_at_step=3) as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.APIStatusError) as caught:
                async with c.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
                    await stream.get_final_message()
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "api_error"


async def test_ping_while_a_long_prefill_runs(fake_cfg, monkeypatch):
    monkeypatch.setattr(anthropic_routes, "PING_INTERVAL_S", 0.05)
    gate = StepGate()  # no step runs until allowed: the "prefill" takes as long as the test wants
    body = {"model": MODEL, "max_tokens": 3, "messages": USER, "stream": True}
    with trio.fail_after(20):
        async with fake_server(fake_cfg, gate=gate) as srv, httpx.AsyncClient() as http:
            async with http.stream("POST", f"{srv.url}/v1/messages", json=body) as resp:
                lines = resp.aiter_lines()
                seen = []
                while "event: ping" not in seen:
                    seen.append(await lines.__anext__())
                gate.allow(100)
                rest = [line async for line in lines]
    assert seen[0] == "event: message_start"
    assert "event: message_stop" in rest and "event: content_block_delta" in rest


async def test_disconnect_mid_stream_frees_the_request(fake_cfg):
    body = {"model": MODEL, "messages": USER, "stream": True, "max_tokens": 4000}
    with trio.fail_after(20):
        async with fake_server(fake_cfg, text="abc", then_eos=False) as srv:
            async with httpx.AsyncClient() as http:
                async with http.stream("POST", f"{srv.url}/v1/messages", json=body) as resp:
                    lines = resp.aiter_lines()
                    while (await lines.__anext__()) != "event: content_block_delta":
                        pass
            await wait_until(srv.engine.statistics, until=engine_idle, poll_s=0.01)
            stats = srv.engine.statistics()
            disconnected = srv.engine.metrics.render().decode()
    assert stats.scheduler.num_aborted == 1 and stats.cache.num_leased == 0
    assert any(
        line.startswith("vllm:http_requests_client_disconnected_total") and line.endswith(" 1.0")
        for line in disconnected.splitlines()
    )


def test_api_key_header_is_the_fallback_to_bearer():
    keys = ApiKeys([KEY])
    assert keys.refusal(None, KEY.encode()) is None
    assert keys.refusal(b"Basic abc", KEY.encode()) is None  # not a Bearer token: x-api-key decides
    assert keys.refusal(f"Bearer {KEY}".encode(), b"wrong") is None
    assert keys.refusal(b"Bearer wrong", KEY.encode()) == INVALID_KEY_MESSAGE  # a Bearer token decides
    assert keys.refusal(None, b"  ") == MISSING_KEY_MESSAGE
