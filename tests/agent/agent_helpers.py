"""Shared helpers for the agent-API tests: servers on the FakeExecutor with scripted text.

(A module of its own, not a conftest.py: tests/structured has a conftest.py too, and test
modules import their helpers by name.)"""

from __future__ import annotations

import functools
import json

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}


def hermes_call(name: str, arguments: dict) -> str:
    """One call in the Qwen/Hermes markup the demo model's template teaches."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def parser_cfg(tool_parser: str = "hermes", reasoning_parser: str = "none"):
    overrides = [
        "server.port=0",
        "server.drain_timeout_s=5",
        f"model.tool_parser={tool_parser}",
        f"model.reasoning_parser={reasoning_parser}",
    ]
    return load_config(None, overrides=overrides, environ={})


#: A server whose every request generates ``text`` then EOS, a few tokens a step (1, 3, 2,
#: cycled): the markup is split anywhere.
scripted_server = functools.partial(fake_server, tokens_per_step=(1, 3, 2))
#: The OpenAI SDK's client for a test server (the agent tests import it from here).
client = openai_client


def streamed_message(chunks) -> dict:
    """The assistant message a client rebuilds from chat chunks (OpenAI's accumulation rules)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        content += delta.content or ""
        reasoning += getattr(delta, "reasoning_content", None) or ""
        for call in delta.tool_calls or ():
            entry = calls.setdefault(call.index, {"id": None, "name": None, "arguments": "", "firsts": 0})
            if call.id is not None:
                entry["id"] = call.id
                entry["firsts"] += 1
            if call.function and call.function.name is not None:
                entry["name"] = call.function.name
            if call.function and call.function.arguments:
                entry["arguments"] += call.function.arguments
        finish = choice.finish_reason or finish
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)], "finish": finish}
