"""The Messages API on the real demo model (MLX on the CPU), driven by the anthropic SDK."""

from __future__ import annotations

import anthropic
import pytest
import trio

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
            async with anthropic.AsyncAnthropic(base_url=srv.url, api_key="unused", max_retries=0) as c:
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
