"""The request side: tools, tool_choice, the history's calls and results, template kwargs."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from agent_helpers import MODEL, TIME, WEATHER, parser_cfg, scripted_server

from vllm_mlx_trio.actors.admission.actor import AdmissionActor, AdmissionLimits
from vllm_mlx_trio.core.constraint import ConstraintSpec, canonical_json
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.openai.requests import parse_chat
from vllm_mlx_trio.messages import ChatMessage, ChatPrompt
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer
from vllm_mlx_trio.testing.harness import open_fake_engine

ASK = {"role": "user", "content": "Weather in Paris?"}
CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


class Recording(FakeTokenizer):
    """Records what the chat template is called with."""

    calls: list = []

    def apply_chat_template(self, messages, **kwargs):
        Recording.calls.append((messages, kwargs))
        return super().apply_chat_template(messages, add_generation_prompt=kwargs.get("add_generation_prompt", True))


def template_call(body: dict, tool_parser: str | None = "hermes"):
    parsed = parse_chat({"model": MODEL, **body}, model_names=ServedNames((MODEL,)), max_n=8, tool_parser=tool_parser)
    limits = AdmissionLimits(max_context_tokens=4096, default_max_tokens=None, max_stop_sequences=4, vocab_size=259)
    send, recv = trio.open_memory_channel(0)
    actor = AdmissionActor(submit_recv=recv, admit_send=send, tokenizer=Recording(), limits=limits)
    Recording.calls = []
    actor.tokenize(parsed.prompt)
    return Recording.calls[-1]


def test_the_template_gets_tools_calls_results_and_kwargs():
    body = {
        "messages": [ASK, CALLED, RESULT],
        "tools": [WEATHER],
        "chat_template_kwargs": {"enable_thinking": False},
        "reasoning_effort": "low",
    }
    turns, kwargs = template_call(body)
    assert turns == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    assert kwargs["tools"] == [WEATHER]
    assert kwargs["enable_thinking"] is False and kwargs["reasoning_effort"] == "low"


def test_a_plain_chat_calls_the_template_as_before():
    _, kwargs = template_call({"messages": [ASK]})
    assert kwargs == {"add_generation_prompt": True, "tokenize": False}


def test_tool_choice_none_still_renders_the_tools_without_a_parser():
    _, kwargs = template_call({"messages": [ASK], "tools": [WEATHER], "tool_choice": "none"}, tool_parser=None)
    assert kwargs["tools"] == [WEATHER]


def test_required_and_named_choices_become_tool_call_constraints():
    body = {"model": MODEL, "messages": [ASK], "tools": [WEATHER, TIME]}
    required = parse_chat(
        {**body, "tool_choice": "required"}, model_names=ServedNames((MODEL,)), max_n=8, tool_parser="hermes"
    )
    assert required.params.constraint == ConstraintSpec(
        kind="tool_calls", body=canonical_json([WEATHER, TIME]), tool_call_format="hermes", parallel=True
    )
    named = {"type": "function", "function": {"name": "get_time"}}
    one = parse_chat({**body, "tool_choice": named}, model_names=ServedNames((MODEL,)), max_n=8, tool_parser="hermes")
    assert one.params.constraint == ConstraintSpec(
        kind="tool_calls", body=canonical_json([TIME]), tool_call_format="hermes", parallel=False
    )
    single = parse_chat(
        {**body, "tool_choice": "required", "parallel_tool_calls": False},
        model_names=ServedNames((MODEL,)),
        max_n=8,
        tool_parser="hermes",
    )
    assert single.params.constraint.parallel is False
    auto = parse_chat(body, model_names=ServedNames((MODEL,)), max_n=8, tool_parser="hermes")
    assert auto.params.constraint is None and auto.tools.parse_calls


async def test_the_library_takes_a_chat_prompt_with_tools(monkeypatch):
    seen = []
    plain = FakeTokenizer.apply_chat_template

    def recording(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        seen.append((messages, kwargs))
        return plain(self, messages, add_generation_prompt, tokenize)

    monkeypatch.setattr(FakeTokenizer, "apply_chat_template", recording)
    prompt = ChatPrompt(
        messages=[
            ChatMessage(role="user", content="hi"),
            ChatMessage(**{k: v for k, v in CALLED.items()}),
            ChatMessage(**RESULT),
        ],
        tools=[WEATHER],
        template_kwargs={"enable_thinking": True},
    )
    with trio.fail_after(10):
        async with open_fake_engine(step_s=0.001) as fake:
            async for _ in fake.engine.generate(prompt, SamplingParams(max_tokens=2)):
                pass
            async for _ in fake.engine.generate([ASK, CALLED, RESULT], SamplingParams(max_tokens=2)):  # dicts too
                pass
    assert seen[0][1] == {"tools": [WEATHER], "enable_thinking": True}
    assert seen[0][0][1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert seen[1][0][2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


BAD = [
    ("no tool parser", {"tools": [WEATHER]}, "tools", "none"),
    (
        "unknown named tool",
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
        "hermes",
    ),
    ("tool_choice without tools", {"tool_choice": "required"}, "tool_choice", "hermes"),
    ("a tool name twice", {"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "hermes"),
    (
        "forced calls and a response format",
        {"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
        "tool_choice",
        "hermes",
    ),
    ("a reserved template kwarg", {"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs", "hermes"),
    (
        "a tool turn without its call id",
        {"messages": [ASK, CALLED, {"role": "tool", "content": "x"}]},
        "messages[2].tool_call_id",
        "hermes",
    ),
    (
        "calls on a user turn",
        {"messages": [{**ASK, "tool_calls": CALLED["tool_calls"]}]},
        "messages[0].tool_calls",
        "hermes",
    ),
    (
        "null content without calls",
        {"messages": [{"role": "assistant", "content": None}, ASK]},
        "messages[0].content",
        "hermes",
    ),
    (
        "reasoning on a user turn",
        {"messages": [{**ASK, "reasoning_content": "x"}]},
        "messages[0].reasoning_content",
        "hermes",
    ),
    (
        "reasoning not text",
        {"messages": [{"role": "assistant", "content": "a", "reasoning": 5}, ASK]},
        "messages[0].reasoning",
        "hermes",
    ),
    (
        "a malformed call",
        {"messages": [ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]},
        "messages[1].tool_calls",
        "hermes",
    ),
]


@pytest.mark.parametrize(("case", "fields", "param", "tool_parser"), BAD, ids=[b[0] for b in BAD])
async def test_what_cannot_be_done_is_a_400_naming_it(case, fields, param, tool_parser):
    body = {"model": MODEL, "messages": [ASK], **fields}
    with trio.fail_after(20):
        async with scripted_server(parser_cfg(tool_parser), "x") as srv, httpx.AsyncClient() as http:
            reply = await http.post(f"{srv.url}/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert error["message"]


async def test_completions_take_no_tools():
    body = {"model": MODEL, "prompt": "p", "tools": [WEATHER]}
    with trio.fail_after(20):
        async with scripted_server(parser_cfg(), "x") as srv, httpx.AsyncClient() as http:
            reply = await http.post(f"{srv.url}/v1/completions", json=body)
    assert reply.status_code == 400
    assert json.loads(reply.text)["error"]["code"] == "unsupported_parameter"


@pytest.mark.parametrize(
    ("tool_parser", "markup"),
    [
        (None, "llama3_json"),
        ("deepseek_v3", "llama3_json"),
        ("openai", "llama3_json"),
        ("kimi_k2", "llama3_json"),
        ("qwen3_coder", "qwen3_coder"),
        ("glm45", "glm45"),
        ("hermes", "hermes"),
    ],
)
def test_forced_calls_take_the_models_markup_or_json_calls_read_back(tool_parser, markup):
    body = {"model": MODEL, "messages": [ASK], "tools": [WEATHER], "tool_choice": "required"}
    names = ServedNames((MODEL,))
    forced = parse_chat(body, model_names=names, max_n=8, tool_parser=tool_parser)
    assert forced.params.constraint.tool_call_format == markup and forced.tools.parser == markup
    if tool_parser is not None:
        auto = parse_chat({**body, "tool_choice": "auto"}, model_names=names, max_n=8, tool_parser=tool_parser)
        assert auto.params.constraint is None and auto.tools.parser == tool_parser
