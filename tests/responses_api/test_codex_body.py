"""Codex CLI's /v1/responses traffic: every tool kind it declares, every input item it replays,
and the calls going back in the shape Codex routes (a namespace kept, a custom tool's input)."""

from __future__ import annotations

import functools
import json

import openai
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.responses.translate import parse_responses
from vllm_mlx_trio.output_format import OutputFormat
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.fake_executor import FakeExecutor, FakeTokenizer
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
APPLY_PATCH_LARK = 'start: "*** Begin Patch\\n" /[^*]+/ "*** End Patch"\n'
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command.",
    "strict": False,
    "parameters": {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}, "minLength": 1}},
        "required": ["command"],
        "additionalProperties": False,
    },
}
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files with a patch.",
    "format": {"type": "grammar", "syntax": "lark", "definition": APPLY_PATCH_LARK},
}
GITHUB = {
    "type": "namespace",
    "name": "mcp__github__",
    "description": "Tools of the github MCP server.",
    "tools": [
        {
            "type": "function",
            "name": "create_issue",
            "description": "Opens an issue.",
            "parameters": {"type": "object", "properties": {"title": {"type": "string"}}, "required": ["title"]},
        }
    ],
}
TOOLS = [SHELL, APPLY_PATCH, {"type": "web_search"}, GITHUB]
#: Earlier turns as Codex resends them (it is stateless: store false, the whole history each turn).
HISTORY = [
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "<permissions>ask</permissions>"}],
    },
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "# AGENTS.md instructions\nBe neat."}],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the typo and file an issue."}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": "gAAAAB-opaque"},
    {
        "type": "custom_tool_call",
        "call_id": "call_1",
        "name": "apply_patch",
        "input": "*** Begin Patch\nfix\n*** End Patch",
    },
    {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"},
    {
        "type": "function_call",
        "call_id": "call_2",
        "name": "create_issue",
        "namespace": "mcp__github__",
        "arguments": '{"title": "typo"}',
    },
    {"type": "function_call_output", "call_id": "call_2", "output": "issue #7"},
]
CODEX_FIELDS = {
    "instructions": "You are Codex.",
    "tools": TOOLS,
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "thread-1234",
    "text": {"verbosity": "low"},
}


def call_markup(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def hermes_cfg():
    overrides = ["server.port=0", "server.drain_timeout_s=5", "model.tool_parser=hermes"]
    return load_config(None, overrides=overrides, environ={})


server = functools.partial(fake_server, tokens_per_step=(1, 3, 2))


def test_history_renders_flat_names_custom_inputs_and_developer_turns():
    body = {"model": MODEL, "input": HISTORY, **CODEX_FIELDS}
    request = parse_responses(body, model_names=ServedNames((MODEL,)), output=OutputFormat(tool_parser="hermes"))
    prompt = request.prompt(())
    names = [tool["function"]["name"] for tool in prompt.tools]
    assert names == ["shell", "apply_patch", "mcp__github__create_issue"]  # web_search is not rendered
    patch = prompt.tools[1]["function"]["parameters"]["properties"]["input"]
    assert APPLY_PATCH_LARK in patch["description"]
    calls = [call for turn in prompt for call in turn.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("apply_patch", {"input": "*** Begin Patch\nfix\n*** End Patch"}),
        ("mcp__github__create_issue", {"title": "typo"}),
    ]
    assert [turn.role for turn in prompt][:2] == ["system", "developer"]  # the template decides (admission)
    assert [turn.text for turn in prompt if turn.role == "tool"] == ["Done!", "issue #7"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_namespaced_call_goes_back_with_its_namespace(stream):
    reply = call_markup("mcp__github__create_issue", {"title": "Typo in README"})
    kwargs = {"model": MODEL, "input": HISTORY, **CODEX_FIELDS, "stream": stream}
    executors: list[FakeExecutor] = []
    with trio.fail_after(20):
        async with server(hermes_cfg(), reply, executors=executors) as srv, openai_client(srv.url) as c:
            if stream:
                async with c.responses.stream(**{k: v for k, v in kwargs.items() if k != "stream"}) as s:
                    response = await s.get_final_response()
            else:
                response = await c.responses.create(**kwargs)
    [call] = response.output
    assert call.type == "function_call" and call.name == "create_issue"
    assert call.namespace == "mcp__github__" and json.loads(call.arguments) == {"title": "Typo in README"}
    prompt = FakeTokenizer().decode(list(executors[0].plans[0].new_seqs[0].prompt_token_ids))
    # developer -> system (the fake template does not know the role), encrypted reasoning dropped
    assert prompt.startswith("<|im_start|>system\nYou are Codex.<|im_end|>\n<|im_start|>system\n<permissions>")
    assert "gAAAAB" not in prompt


@pytest.mark.parametrize("stream", [False, True])
async def test_a_custom_tool_call_carries_its_input(stream):
    patch = "*** Begin Patch\n*** Update File: README.md\n-teh\n+the\n*** End Patch"
    reply = "On it." + call_markup("apply_patch", {"input": patch})
    kwargs = {"model": MODEL, "input": "Fix the typo.", "tools": TOOLS}
    with trio.fail_after(20):
        async with server(hermes_cfg(), reply) as srv, openai_client(srv.url) as c:
            if stream:
                async with c.responses.stream(**kwargs) as s:
                    events = [event async for event in s]
                    response = await s.get_final_response()
                deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
                [done] = [e for e in events if e.type == "response.custom_tool_call_input.done"]
                assert "".join(deltas) == done.input == patch
            else:
                response = await c.responses.create(**kwargs)
    message, call = response.output
    assert message.type == "message" and response.output_text == "On it."
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == patch and call.call_id


async def test_probe_with_empty_input_is_answered():
    with trio.fail_after(20):
        async with server(hermes_cfg(), "ok") as srv, openai_client(srv.url) as c:
            probe = await c.responses.create(model=MODEL, input=[], max_output_tokens=1, tools=TOOLS, store=False)
            with_instructions = await c.responses.create(model=MODEL, input=[], instructions="Say ok.")
    assert probe.status == "incomplete" and probe.output_text == "o"
    assert with_instructions.output_text == "ok"


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([SHELL, {"type": "computer_use_2030"}], "auto", "tools[1].type"),
        ([{**GITHUB, "tools": [{"type": "web_search"}]}], "auto", "tools[0].tools[0].type"),
        (
            [SHELL, {**APPLY_PATCH, "format": {"type": "grammar", "syntax": "peg", "definition": "x"}}],
            "auto",
            "tools[1].format.syntax",
        ),
        ([SHELL, {**SHELL, "colour": "red"}], "auto", "tools[1].colour"),
        ([SHELL, SHELL], "auto", "tools[1].name"),
        ([SHELL, {"type": "web_search"}], {"type": "web_search"}, "tool_choice.type"),
        ([SHELL], {"type": "custom", "name": "apply_patch"}, "tool_choice"),
    ],
)
async def test_tools_refused_name_their_path(tools, choice, param):
    with trio.fail_after(20):
        async with server(hermes_cfg(), "x") as srv, openai_client(srv.url) as c:
            with pytest.raises(openai.BadRequestError) as caught:
                await c.responses.create(model=MODEL, input="hi", tools=tools, tool_choice=choice)
    error = caught.value.body
    assert error["param"] == param and error["message"].startswith(param)
