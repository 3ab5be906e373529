"""reasoning_content split from scripted output (FakeExecutor), streamed and not."""

from __future__ import annotations

import trio
from agent_helpers import MODEL, WEATHER, client, hermes_call, parser_cfg, scripted_server, streamed_message

from vllm_mlx_trio.testing.fake_executor import FakeTokenizer

TIMEOUT_S = 30
ASK = [{"role": "user", "content": "Think, then answer."}]


async def both(text, cfg, **request):
    request = {"model": MODEL, "messages": ASK, **request}
    async with scripted_server(cfg, text) as srv, client(srv.url) as c:
        whole = await c.chat.completions.create(**request)
        stream = await c.chat.completions.create(**request, stream=True)
        chunks = [chunk async for chunk in stream]
    return whole, chunks


async def test_the_thinking_block_is_reasoning_content():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both("<think>\nadd 2 and 2\n</think>\n\nIt is 4.", parser_cfg("none", "qwen3"))
    message = whole.choices[0].message
    assert (message.reasoning_content, message.content) == ("add 2 and 2", "It is 4.")
    assert message.model_extra["reasoning"] == "add 2 and 2"  # the alias some clients read
    streamed = streamed_message(chunks)
    assert (streamed["reasoning"], streamed["content"]) == ("add 2 and 2", "It is 4.")
    assert whole.choices[0].finish_reason == streamed["finish"] == "stop"


async def test_without_a_reasoning_parser_the_thinking_stays_content():
    text = "<think>hmm</think>It is 4."
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(text, parser_cfg("none", "none"))
    assert whole.choices[0].message.content == text
    assert "reasoning_content" not in whole.choices[0].message.model_extra
    assert streamed_message(chunks)["content"] == text


async def test_calls_inside_the_thinking_block_are_not_calls():
    inner = hermes_call("get_weather", {"city": "Oslo"})
    outer = hermes_call("get_weather", {"city": "Paris"})
    text = f"<think>maybe {inner}</think>{outer}"
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(text, parser_cfg("hermes", "qwen3"), tools=[WEATHER])
    message = whole.choices[0].message
    assert message.reasoning_content == f"maybe {inner}"
    assert [c.function.arguments for c in message.tool_calls] == ['{"city": "Paris"}']
    assert whole.choices[0].finish_reason == "tool_calls"
    streamed = streamed_message(chunks)
    assert streamed["reasoning"] == message.reasoning_content
    assert [c["arguments"] for c in streamed["calls"]] == ['{"city": "Paris"}']


async def test_a_template_that_opens_the_block_starts_the_reply_as_reasoning(monkeypatch):
    # Like Qwen3's templates with thinking forced on: the prompt ends with "<think>\n", so the
    # model's output has only the closer. enable_thinking reaches the template as a variable.
    plain = FakeTokenizer.apply_chat_template

    def opening(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        text = plain(self, messages, add_generation_prompt, tokenize)
        return text + ("<think>\n" if kwargs.get("enable_thinking") else "")

    monkeypatch.setattr(FakeTokenizer, "apply_chat_template", opening)
    text = "weigh it\n</think>\n\nIt is 4."
    cfg = parser_cfg("none", "qwen3")
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(text, cfg, extra_body={"chat_template_kwargs": {"enable_thinking": True}})
        off, _ = await both(text, cfg)
    assert (whole.choices[0].message.reasoning_content, whole.choices[0].message.content) == ("weigh it", "It is 4.")
    streamed = streamed_message(chunks)
    assert (streamed["reasoning"], streamed["content"]) == ("weigh it", "It is 4.")
    # Not opened by the template: the stray closer is dropped, the text before it is content.
    assert off.choices[0].message.reasoning_content is None
    assert "</think>" not in off.choices[0].message.content


async def test_logprobs_follow_their_tokens_through_the_parser():
    text = "<think>ab</think>cd"
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(text, parser_cfg("none", "qwen3"), logprobs=True)
    carried = [ch.choices[0].logprobs for ch in chunks if ch.choices and ch.choices[0].logprobs]
    streamed = [entry for logprobs in carried for entry in logprobs.content]
    assert len(whole.choices[0].logprobs.content) == whole.usage.completion_tokens == len(text) + 1  # + EOS
    assert [e.token for e in streamed] == [e.token for e in whole.choices[0].logprobs.content]


async def test_a_reply_sent_back_whole_is_accepted_and_its_reasoning_reaches_the_template(monkeypatch):
    # openai-python users append reply.choices[0].message to the history as it is: with a
    # reasoning parser it carries reasoning_content and reasoning (content null when only thinking).
    seen = []
    plain = FakeTokenizer.apply_chat_template

    def recording(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        seen.append(messages)
        return plain(self, messages, add_generation_prompt, tokenize)

    monkeypatch.setattr(FakeTokenizer, "apply_chat_template", recording)
    with trio.fail_after(TIMEOUT_S):
        async with scripted_server(parser_cfg("none", "qwen3"), "<think>hmm</think>") as srv, client(srv.url) as c:
            first = await c.chat.completions.create(model=MODEL, messages=ASK)
            echoed = first.choices[0].message.model_dump()
            again = await c.chat.completions.create(model=MODEL, messages=[*ASK, echoed, *ASK])
    assert echoed["content"] is None and echoed["reasoning_content"] == echoed["reasoning"] == "hmm"
    assert again.choices[0].finish_reason == "stop"
    assert seen[-1][1] == {"role": "assistant", "content": "", "reasoning_content": "hmm"}


THOUGHT = "<think>\nadd 2 and 2\n</think>\n\nIt is 4."
#: The byte-level fake tokenizer: one token per byte of the split-out reasoning.
REASONING_TOKENS = len(b"add 2 and 2")


async def test_reasoning_tokens_are_counted_in_usage():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(THOUGHT, parser_cfg("none", "qwen3"), stream_options=None)
        async with scripted_server(parser_cfg("none", "qwen3"), THOUGHT) as srv, client(srv.url) as c:
            stream = await c.chat.completions.create(
                model=MODEL, messages=ASK, stream=True, stream_options={"include_usage": True}
            )
            usage = [chunk.usage async for chunk in stream if chunk.usage][0]
            response = await c.responses.create(model=MODEL, input="Think, then answer.")
    assert whole.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS
    assert response.usage.output_tokens_details.reasoning_tokens == REASONING_TOKENS
    with trio.fail_after(TIMEOUT_S):
        plain, _ = await both(THOUGHT, parser_cfg("none", "none"))
    assert plain.usage.completion_tokens_details.reasoning_tokens == 0  # nothing split out


async def test_include_reasoning_false_leaves_it_out_and_still_counts_it():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(THOUGHT, parser_cfg("none", "qwen3"), extra_body={"include_reasoning": False})
    message = whole.choices[0].message
    assert message.content == "It is 4." and "reasoning_content" not in message.model_extra
    streamed = streamed_message(chunks)
    assert (streamed["reasoning"], streamed["content"]) == ("", "It is 4.")
    assert whole.usage.completion_tokens_details.reasoning_tokens == REASONING_TOKENS


async def test_separate_reasoning_false_keeps_the_thinking_in_the_content():
    with trio.fail_after(TIMEOUT_S):
        whole, chunks = await both(THOUGHT, parser_cfg("none", "qwen3"), extra_body={"separate_reasoning": False})
    assert whole.choices[0].message.content == THOUGHT
    assert streamed_message(chunks)["content"] == THOUGHT
    assert whole.usage.completion_tokens_details.reasoning_tokens == 0


async def test_stream_reasoning_false_sends_the_reasoning_in_one_delta_when_it_ends():
    with trio.fail_after(TIMEOUT_S):
        _, chunks = await both(THOUGHT, parser_cfg("none", "qwen3"), extra_body={"stream_reasoning": False})
        _, streamed_chunks = await both(THOUGHT, parser_cfg("none", "qwen3"))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    reasoning = [i for i, d in enumerate(deltas) if getattr(d, "reasoning_content", None)]
    content = [i for i, d in enumerate(deltas) if d.content]
    assert len(reasoning) == 1 and deltas[reasoning[0]].reasoning_content == "add 2 and 2"
    assert reasoning[0] < content[0]
    streamed = [c for c in streamed_chunks if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)]
    assert len(streamed) > 1  # by default it streams as generated
