"""An image inside a tool's result (Claude Code's Read of a PNG) on a text-only model: replaced by
a short text by default (``limits.tool_result_media = "placeholder"``), so the session goes on;
a 400 naming the part with ``"refuse"``, and always for an image the user sends."""

from __future__ import annotations

import anthropic
import attrs
import pytest
import trio

from vllm_mlx_trio.testing.clients import anthropic_client
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
TIMEOUT_S = 20
PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
READ_A_PNG = [
    {"role": "user", "content": "Look at the screenshot."},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a.png"}}]},
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.png:"}, PNG]},
            {"type": "text", "text": "What do you see?"},
        ],
    },
]


def with_mode(cfg, mode: str):
    return attrs.evolve(cfg, limits=attrs.evolve(cfg.limits, tool_result_media=mode))


async def test_a_tools_image_becomes_a_placeholder_the_model_reads(fake_cfg):
    executors: list[FakeExecutor] = []
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(fake_cfg, executors=executors) as srv, anthropic_client(srv.url) as c:
            message = await c.messages.create(model=MODEL, max_tokens=20, messages=READ_A_PNG)
    assert message.content[0].text == "Hello, world!"
    [seq] = [seq for plan in executors[0].plans for seq in plan.new_seqs]
    prompt = FakeTokenizer().decode(list(seq.prompt_token_ids))
    assert "a.png:[image omitted: this model cannot take images]" in prompt and "What do you see?" in prompt


async def test_refuse_keeps_the_400(fake_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(with_mode(fake_cfg, "refuse")) as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await c.messages.create(model=MODEL, max_tokens=20, messages=READ_A_PNG)
    assert "content part of type 'image_url' is not supported by this model" in caught.value.body["error"]["message"]


async def test_an_image_the_user_sends_is_still_refused(fake_cfg):
    messages = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, PNG]}]
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(fake_cfg) as srv, anthropic_client(srv.url) as c:
            with pytest.raises(anthropic.BadRequestError) as caught:
                await c.messages.create(model=MODEL, max_tokens=20, messages=messages)
    assert "messages[0].content[1]" in caught.value.body["error"]["message"]
