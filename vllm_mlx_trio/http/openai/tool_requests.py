"""The agent half of a chat body: ``tools``, ``tool_choice``, ``parallel_tool_calls``, the
history's tool calls and tool results, and the template's extra variables.

What the OpenAI fields mean here (vLLM's choices, so clients carry their habits over):

- ``tools`` are rendered by the chat template (the ``tools`` variable), whatever the choice;
- ``tool_choice: "auto"`` (the default with tools): the reply is parsed for calls by the
  model's tool parser (``[model] tool_parser``); without one it is a 400;
- ``"none"``: the tools are still rendered (as vLLM does), the reply is never parsed for calls;
- ``"required"`` / a named function: the calls are enforced by a grammar
  (``SamplingParams.constraint``, kind ``tool_calls``) in the tool parser's markup, and parsed;
  for a parser no grammar is written for, and on a model with no tool parser, in bare JSON
  objects read back by the llama3_json parser (``structured.tools.forced_call_format``);
  a named function allows exactly one call, ``required`` one or more unless
  ``parallel_tool_calls`` is false;
- ``parallel_tool_calls: false``: at most one call is returned (the first), as vLLM does.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...core.constraint import ConstraintSpec, canonical_json
from ...messages import CalledTool, ChatMessage, ChatPrompt, ContentPart
from ...structured.tools import forced_call_format
from . import schemas
from .schema_errors import bad


@attrs.frozen(kw_only=True)
class ToolUse:
    """What a chat request asks of tool calling, checked."""

    #: The OpenAI tool objects as sent (what the template renders).
    tools: tuple[dict[str, Any], ...]
    #: Parse the reply for calls (``tool_choice`` is not "none").
    parse_calls: bool
    #: More than one call may be returned.
    parallel: bool
    #: The forced calls (``required`` / named), else None.
    constraint: ConstraintSpec | None = None
    #: The parser that reads this request's calls: the model's, or the forced calls' markup.
    parser: str | None = None


def tool_use(chat: schemas.ChatBody, body: dict, tool_parser: str | None) -> ToolUse | None:
    """The request's tool calling (None: no tools), or a 400 naming what cannot be done."""
    choice = chat.tool_choice
    if not chat.tools:
        if choice not in (None, "none"):
            raise bad("tool_choice is only allowed when tools are given.", "tool_choice")
        return None
    tools = tuple(body["tools"])
    names = _tool_names(chat.tools)
    parallel = chat.parallel_tool_calls is not False
    if choice == "none":
        return ToolUse(tools=tools, parse_calls=False, parallel=parallel)
    if choice is None or choice == "auto":
        if tool_parser is None:
            raise bad(
                "This model has no tool parser, so tool calls cannot be read from its output: set "
                '[model] tool_parser (e.g. hermes), or send tool_choice "none", "required" or a named function.',
                "tools",
            )
        return ToolUse(tools=tools, parse_calls=True, parallel=parallel, parser=tool_parser)
    markup = forced_call_format(tool_parser)
    if choice == "required":
        spec = _forced(tools, markup, parallel=parallel)
        return ToolUse(tools=tools, parse_calls=True, parallel=parallel, constraint=spec, parser=markup)
    name = choice.function.name
    if name not in names:
        raise bad(f"tool_choice names function {name!r:.80}, which is not one of the tools given.", "tool_choice")
    named = tuple(tool for tool, tool_name in zip(tools, names, strict=True) if tool_name == name)
    spec = _forced(named, markup, parallel=False)
    return ToolUse(tools=tools, parse_calls=True, parallel=False, constraint=spec, parser=markup)


def _tool_names(tools: list[schemas.Tool]) -> list[str]:
    names: list[str] = []
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not name:
            raise bad(f"tools[{i}].function.name must not be empty.", f"tools[{i}].function.name")
        if name in names:
            raise bad(f"tools[{i}].function.name {name!r:.80} is given twice.", f"tools[{i}].function.name")
        names.append(name)
    return names


def _forced(tools: tuple[dict[str, Any], ...], markup: str, *, parallel: bool) -> ConstraintSpec:
    """Forced calls in ``markup`` (one of ``TOOL_CALL_FORMATS``)."""
    return ConstraintSpec(
        kind="tool_calls", body=canonical_json(list(tools)), tool_call_format=markup, parallel=parallel
    )


def with_tool_constraint(constraint: ConstraintSpec | None, use: ToolUse | None) -> ConstraintSpec | None:
    """The request's one output constraint: forced tool calls, or the structured-output one."""
    if use is None or use.constraint is None:
        return constraint
    if constraint is not None:
        raise bad(
            'tool_choice "required" or a named function cannot be combined with response_format or guided '
            "decoding: both constrain the same output.",
            "tool_choice",
        )
    return use.constraint


def chat_prompt(chat: schemas.ChatBody, messages: tuple[ChatMessage, ...], use: ToolUse | None) -> ChatPrompt:
    """The turns plus what the template gets besides: the tools, ``chat_template_kwargs``
    and ``reasoning_effort`` (as a template variable, as vLLM passes it)."""
    kwargs = dict(chat.chat_template_kwargs or {})
    if chat.reasoning_effort is not None:
        kwargs["reasoning_effort"] = chat.reasoning_effort
    return ChatPrompt(messages=messages, tools=use.tools if use else None, template_kwargs=kwargs)


def tool_message(message: schemas.MessageIn, parts: tuple[ContentPart, ...] | None, where: str) -> ChatMessage:
    """A turn with its agent fields checked: calls and reasoning only on assistant turns,
    ``tool_call_id`` on (and only on) tool turns, null content only beside calls or reasoning."""
    calls = message.tool_calls or []
    if calls and message.role != "assistant":
        raise bad(f"{where}.tool_calls is only allowed on assistant messages.", f"{where}.tool_calls")
    if message.role == "tool" and message.tool_call_id is None:
        raise bad(f"{where}.tool_call_id is required on tool messages.", f"{where}.tool_call_id")
    if message.role != "tool" and message.tool_call_id is not None:
        raise bad(f"{where}.tool_call_id is only allowed on tool messages.", f"{where}.tool_call_id")
    reasoning = message.reasoning_content if message.reasoning_content is not None else message.reasoning
    if reasoning is not None and message.role != "assistant":
        key = "reasoning_content" if message.reasoning_content is not None else "reasoning"
        raise bad(f"{where}.{key} is only allowed on assistant messages.", f"{where}.{key}")
    if parts is None and not calls and not reasoning:
        raise bad(f"{where}.content must be a string or an array of text parts.", f"{where}.content")
    return ChatMessage(
        role=message.role,
        content=parts or (),
        name=message.name,
        tool_calls=tuple(CalledTool(id=c.id, name=c.function.name, arguments=c.function.arguments) for c in calls),
        tool_call_id=message.tool_call_id,
        reasoning=reasoning,
    )
