"""Tools for templates that cannot render them: written into the system turn, read back by hermes."""

from __future__ import annotations

import json

from vllm_mlx_trio.actors.admission.chat_template import render_prompt
from vllm_mlx_trio.messages import CalledTool, ChatMessage, ChatPrompt
from vllm_mlx_trio.parsers import OutputParser
from vllm_mlx_trio.prompting.tool_prompt import TOOL_PROMPT_PARSER, template_takes_tools, tools_in_system_prompt

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
#: SmolLM2-like: every role rendered as given, no ``tools`` variable anywhere.
PLAIN = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


class PlainTokenizer:
    chat_template = PLAIN

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **kwargs):
        assert "tools" not in kwargs  # the template would ignore them
        import jinja2

        return jinja2.Template(PLAIN).render(messages=messages) + "<|im_start|>assistant\n"


def history() -> ChatPrompt:
    call = CalledTool(id="c1", name="get_weather", arguments='{"city": "Oslo"}')
    turns = (
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Weather in Oslo and Rome?"),
        ChatMessage(role="assistant", content="", tool_calls=(call, attrs_call("c2", "Rome"))),
        ChatMessage(role="tool", content="Snow", tool_call_id="c1"),
        ChatMessage(role="tool", content="Sun", tool_call_id="c2"),
    )
    return ChatPrompt(messages=turns, tools=(WEATHER,))


def attrs_call(call_id: str, city: str) -> CalledTool:
    return CalledTool(id=call_id, name="get_weather", arguments=json.dumps({"city": city}))


def test_template_takes_tools_reads_the_variable():
    assert template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_takes_tools(PLAIN) and not template_takes_tools(None)


def test_tools_calls_and_results_become_hermes_text():
    rewritten = tools_in_system_prompt(history())
    assert rewritten.tools is None
    roles = [turn.role for turn in rewritten]
    assert roles == ["system", "user", "assistant", "user"]
    system, _, assistant, results = rewritten.messages
    assert system.text.startswith("Be brief.\n\n# Tools") and json.dumps(WEATHER) in system.text
    assert assistant.text.count("<tool_call>") == 2 and '"arguments": {"city": "Rome"}' in assistant.text
    assert results.text == "<tool_response>\nSnow\n</tool_response>\n<tool_response>\nSun\n</tool_response>"


def test_a_template_without_tools_gets_them_in_its_system_turn_and_the_reply_parses():
    rendered = render_prompt(PlainTokenizer(), history())
    assert "<tools>\n" in rendered and rendered.count("<|im_start|>system") == 1
    parser = OutputParser(tool_parser=TOOL_PROMPT_PARSER, reasoning_parser=None, tools=(WEATHER,))
    parser.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    parser.finish()
    [call] = parser.message().tool_calls
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
