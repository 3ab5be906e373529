"""OpenCode's chat-completions body through the openai SDK on the real demo model, served with a
strict Qwen-style template that refuses a system message anywhere but first: its three system
messages are merged to the front, its tools rendered, its tool loop answered."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
from agent_helpers import client

from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
#: Qwen3.5-style strictness, ChatML output, tools rendered as Qwen's templates render them.
STRICT = (
    "{%- if tools %}<|im_start|>system\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools><|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}{%- if not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{%- endif %}"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}\n<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments}"
    " | tojson }}\n</tool_call>{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
READ = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Reads a file.",
        "parameters": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"filePath": {"type": "string", "enum": ["/app/README.md", "/app/setup.py"]}},
            "required": ["filePath"],
            "additionalProperties": False,
        },
    },
}
SYSTEMS = [
    {"role": "system", "content": "You are opencode, an interactive CLI tool."},
    {"role": "system", "content": "Here is useful information about the environment: <env>cwd: /app</env>"},
    {"role": "system", "content": "Instructions from: /app/AGENTS.md\nUse pytest."},
]


async def test_opencodes_three_system_messages_and_tool_loop_on_a_strict_template(demo_cfg):
    cfg = attrs.evolve(demo_cfg, model=attrs.evolve(demo_cfg.model, chat_template=STRICT, tool_parser="hermes"))
    ask = [*SYSTEMS, {"role": "user", "content": "What does the README say?"}]
    request = {"model": MODEL, "tools": [READ], "max_tokens": 120, "temperature": 0}
    with trio.fail_after(180):
        async with open_server(cfg) as srv, client(srv.url) as c:
            stream = await c.chat.completions.create(
                **request, messages=ask, tool_choice="required", stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
            calls: dict[int, dict] = {}
            for chunk in chunks:
                for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    entry = calls.setdefault(call.index, {"id": call.id, "name": call.function.name, "arguments": ""})
                    entry["arguments"] += call.function.arguments or ""
            [call] = calls.values()
            turn = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            }
            result = {"role": "tool", "tool_call_id": call["id"], "content": "# App\nRun it with make."}
            answered = await c.chat.completions.create(**request, messages=[*ask, turn, result])
    assert call["name"] == "read" and json.loads(call["arguments"])["filePath"] in ("/app/README.md", "/app/setup.py")
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
    assert answered.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert answered.usage.prompt_tokens_details.cached_tokens > 0  # the first request's prompt, reused
