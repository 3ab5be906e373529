"""The demo VLM (tiny Qwen2-VL, M-RoPE) over HTTP with the openai client, on MLX on the CPU."""

from __future__ import annotations

import openai
import pytest
import trio
from vlm_helpers import MODEL, image_message, image_url

from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
#: Text before the image: more than two 16-token cache blocks.
PREAMBLE = "You are a careful assistant. Look at the picture below and answer in one short sentence. " * 2


def client(srv) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0)


async def chat(c, messages, **kwargs):
    return await c.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=8, **kwargs)


async def test_image_streams_and_a_repeat_hits_the_cache_past_the_image(vlm_cfg):
    messages = [image_message(PREAMBLE, image_url(1))]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(vlm_cfg) as srv, client(srv) as c:
            stream = await c.chat.completions.create(
                model=MODEL, messages=messages, temperature=0, max_tokens=8, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = [chunk async for chunk in stream]
            again = await chat(c, messages)
            models = await c.models.list()
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    usage = chunks[-1].usage
    assert text and text == again.choices[0].message.content  # greedy: the hit continues exactly
    assert usage.completion_tokens == 8 and usage.prompt_tokens > 12
    cached = again.usage.prompt_tokens_details.cached_tokens
    # the image's 12 tokens sit after the preamble; the repeat reuses KV past all of them
    assert cached >= usage.prompt_tokens - 16 and cached > len(PREAMBLE) // 8 + 12
    [model] = models.data
    assert model.model_extra.get("input_modalities") == ["text", "image", "video"]
