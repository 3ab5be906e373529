"""The official SDKs on the real trained demo:smollm2: the openai client (whole and streamed) and
the anthropic client (the server's /v1/messages) get the model's greedy answer."""

from __future__ import annotations

import pytest
import trio
from smollm2_helpers import FRANCE, MAX_TOKENS, MODEL, PARIS, TIMEOUT_S, chat

from vllm_mlx_trio.testing.clients import anthropic_client, openai_client

pytestmark = [pytest.mark.mlx, pytest.mark.smollm2]


async def test_the_openai_client_gets_the_greedy_answer_whole_and_streamed(smollm2_url, reference):
    expected = reference.greedy(chat(FRANCE))
    request = {"model": MODEL, "messages": chat(FRANCE), "max_tokens": MAX_TOKENS, "temperature": 0}
    with trio.fail_after(TIMEOUT_S):
        async with openai_client(smollm2_url) as client:
            whole = await client.chat.completions.create(**request)
            stream = await client.chat.completions.create(
                **request, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
    assert whole.choices[0].message.content == expected.text and PARIS in expected.text
    assert whole.choices[0].finish_reason == "stop"
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finishes = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert streamed == expected.text and finishes == ["stop"]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens == len(reference.prompt_ids(chat(FRANCE)))


async def test_the_anthropic_client_gets_the_greedy_answer(smollm2_url, reference):
    expected = reference.greedy(chat(FRANCE))
    # temperature is not a keyword of the newest SDK: older clients send it, so does this test
    kwargs = {"model": MODEL, "max_tokens": MAX_TOKENS, "messages": chat(FRANCE), "extra_body": {"temperature": 0}}
    with trio.fail_after(TIMEOUT_S):
        async with anthropic_client(smollm2_url) as client:
            message = await client.messages.create(**kwargs)
            async with client.messages.stream(**kwargs) as stream:
                streamed = "".join([text async for text in stream.text_stream])
                final = await stream.get_final_message()
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == expected.text and PARIS in expected.text
    assert message.stop_reason == "end_turn"
    assert streamed == final.content[0].text == expected.text and final.stop_reason == "end_turn"


async def test_claude_codes_tool_loop_on_a_model_whose_template_has_no_tools(smollm2_url):
    """SmolLM2's template renders no tools: they are written into its system turn, a forced call
    comes back as a tool_use block, and the tool's result is answered in the next turn."""
    from vllm_mlx_trio.bench.agents.shapes import READ_SCHEMA

    read = {"name": "Read", "description": "Reads a file from the local filesystem.", "input_schema": READ_SCHEMA}
    ask = [{"role": "user", "content": "Read the file /etc/hostname."}]
    kwargs = {"model": MODEL, "max_tokens": 64, "tools": [read], "extra_body": {"temperature": 0}}
    with trio.fail_after(TIMEOUT_S):
        async with anthropic_client(smollm2_url) as client:
            called = await client.messages.create(**kwargs, messages=ask, tool_choice={"type": "any"})
            [use] = [block for block in called.content if block.type == "tool_use"]
            result = {"type": "tool_result", "tool_use_id": use.id, "content": "paris-01"}
            history = [*ask, {"role": "assistant", "content": called.content}, {"role": "user", "content": [result]}]
            answered = await client.messages.create(**kwargs, messages=history)
    assert called.stop_reason == "tool_use" and use.name == "Read"
    assert isinstance(use.input["file_path"], str) and use.input["file_path"]
    assert answered.stop_reason in ("end_turn", "max_tokens", "tool_use") and answered.usage.output_tokens > 0
    assert answered.usage.cache_read_input_tokens > 0  # the first turn's prompt, reused
