"""Tools for a model whose chat template cannot render them: described in the system turn.

Many chat templates (SmolLM2's, Gemma 2's, most base-model templates) never read the ``tools``
variable, so a request's tools would silently vanish from the prompt. For such a template the
tools are written into the system turn in the Hermes format (the one Qwen 2.5/3 and the Hermes
models were trained on): the function schemas inside ``<tools></tools>``, and the instruction
to call one as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, which the
``hermes`` tool parser reads back. Earlier calls become that markup in the assistant turn's
text, and tool results become user turns wrapped in ``<tool_response>``, as Qwen's template
writes them, so every turn renders through a template that knows only system, user and
assistant.
"""

from __future__ import annotations

import json
import re

import attrs

from ..chat_messages import ChatMessage, ChatPrompt, TextPart

#: The tool parser that reads calls written as :data:`TOOLS_INSTRUCTION` asks.
TOOL_PROMPT_PARSER = "hermes"
TOOLS_INSTRUCTION = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_TOOLS_VARIABLE = re.compile(r"\btools\b")


def template_takes_tools(template_source: str | None) -> bool:
    """Whether the chat template reads the ``tools`` variable at all."""
    return template_source is not None and _TOOLS_VARIABLE.search(template_source) is not None


def tools_in_system_prompt(prompt: ChatPrompt) -> ChatPrompt:
    """``prompt`` with its tools described in the system turn and no ``tools`` variable; calls
    and tool results as text in the Hermes markup."""
    if not prompt.tools:
        return prompt
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in prompt.tools)
    instruction = TOOLS_INSTRUCTION.format(tools=listed)
    turns = _as_text_turns(prompt.messages)
    head = turns[0] if turns else None
    if head is not None and head.role == "system" and head.text is not None:
        system = ChatMessage(role="system", content=f"{head.text}\n\n{instruction}" if head.text else instruction)
        turns = (system, *turns[1:])
    else:
        turns = (ChatMessage(role="system", content=instruction), *turns)
    return attrs.evolve(prompt, messages=turns, tools=None)


def _as_text_turns(messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    for message in messages:
        if message.tool_calls:
            calls = "\n".join(_call_markup(call.name, call.arguments) for call in message.tool_calls)
            text = f"{message.text}\n{calls}" if message.text else calls
            out.append(ChatMessage(role="assistant", content=text, reasoning=message.reasoning))
        elif message.role == "tool":
            response = f"<tool_response>\n{message.text or ''}\n</tool_response>"
            previous = out[-1] if out else None
            if previous is not None and previous.role == "user" and (previous.text or "").endswith("</tool_response>"):
                out[-1] = ChatMessage(role="user", content=f"{previous.text}\n{response}")
            else:
                out.append(ChatMessage(role="user", content=(TextPart(text=response),)))
        else:
            out.append(message)
    return tuple(out)


def _call_markup(name: str, arguments: str) -> str:
    try:
        decoded = json.loads(arguments)
    except ValueError:
        decoded = arguments
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': decoded}, ensure_ascii=False)}\n</tool_call>"
