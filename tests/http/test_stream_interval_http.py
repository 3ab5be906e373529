"""``engine.stream_interval`` over each streaming protocol: the OpenAI chat stream, Anthropic's
``content_block_delta`` events and the Responses API's ``output_text.delta`` events each carry
the first token alone, then ``stream_interval`` tokens at a time (one character per token on the
fake executor), and the rest with the finish."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import FAKE_TEXT, fake_server

MODEL = "demo:tiny"
USER = [{"role": "user", "content": "hi"}]
TIMEOUT_S = 30
#: Steps slow enough that the server's stream writer always keeps up (no coalescing).
STEP_S = 0.01


def expected_pieces(interval: int, text: str = FAKE_TEXT) -> list[str]:
    """``text`` (one token per character) cut as the interval cuts it: the first character alone,
    then ``interval`` at a time; the EOS after it has no text."""
    rest = text[1:]
    return [text[0], *(rest[i : i + interval] for i in range(0, len(rest), interval))]


def with_interval(cfg, interval: int):
    return attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, stream_interval=interval))


@pytest.mark.parametrize("interval", [1, 4])
async def test_openai_chat_stream_follows_the_interval(fake_cfg, interval):
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(with_interval(fake_cfg, interval), step_s=STEP_S) as srv, openai_client(srv.url) as c:
            stream = await c.chat.completions.create(model=MODEL, messages=USER, stream=True)
            pieces = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert [p for p in pieces if p] == expected_pieces(interval)


@pytest.mark.parametrize("interval", [1, 4])
async def test_anthropic_stream_follows_the_interval(fake_cfg, interval):
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(with_interval(fake_cfg, interval), step_s=STEP_S) as srv, anthropic_client(srv.url) as c:
            async with c.messages.stream(model=MODEL, max_tokens=100, messages=USER) as stream:
                pieces = [
                    event.delta.text
                    async for event in stream
                    if event.type == "content_block_delta" and event.delta.type == "text_delta"
                ]
    assert pieces == expected_pieces(interval)


@pytest.mark.parametrize("interval", [1, 4])
async def test_responses_stream_follows_the_interval(fake_cfg, interval):
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(with_interval(fake_cfg, interval), step_s=STEP_S) as srv, openai_client(srv.url) as c:
            async with c.responses.stream(model=MODEL, input=USER) as stream:
                pieces = [event.delta async for event in stream if event.type == "response.output_text.delta"]
    assert pieces == expected_pieces(interval)
