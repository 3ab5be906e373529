"""Anthropic tool use and thinking onto the engine's tool calling: the output parsers and
grammar constraints the chat route uses.

- ``tools`` (``name``, ``description``, ``input_schema``) become OpenAI function tools the chat
  template renders; ``tool_use`` blocks of the history become the assistant turn's calls and
  ``tool_result`` blocks become ``tool`` turns (``is_error`` results start with "Error: "; their
  images become image parts of the turn, as a user turn's do).
- ``tool_choice``: ``auto`` (the default with tools) parses the reply for calls with the
  model's tool parser (a 400 without one); ``any`` and ``tool`` force the calls with a
  grammar (``ConstraintSpec`` kind ``tool_calls``; ``tool`` allows exactly that one tool);
  ``none`` renders the tools and never parses calls; ``disable_parallel_tool_use`` allows
  one call at most.
- ``thinking``: ``enabled`` / ``disabled`` set the template's ``enable_thinking`` switch; the
  reply's reasoning (with the model's reasoning parser) becomes a ``thinking`` block.
  ``budget_tokens`` is checked as Anthropic checks it (>= 1024, below ``max_tokens``) and
  enforced during generation (:mod:`...core.thinking_budget`): after that many tokens inside
  the thinking block its end marker is forced; ``max_tokens`` bounds both together.
- ``output_config``: ``format`` (``json_schema``) constrains the reply with the grammar, as
  ``response_format`` does on the chat route (not together with forced tool use); ``effort``
  ``low``/``medium``/``high`` is the template's ``reasoning_effort``; ``xhigh``/``max`` are a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from ...core.constraint import ConstraintSpec, canonical_json
from ...core.thinking_budget import ThinkingBudget
from ...errors import InvalidRequestError
from ...messages import ImagePart, TextPart
from ...output_format import OutputFormat
from ...structured.tools import forced_call_format
from ..agent_output import OutputSpec
from . import schemas

#: A tool turn's content: its text, or its text and image parts in order.
ToolContent = str | tuple[TextPart | ImagePart, ...]
#: The (start, end) markers of a thinking block as token ids.
MarkerIds = tuple[tuple[int, ...], tuple[int, ...]]
#: Anthropic's smallest thinking budget.
MIN_THINKING_BUDGET = 1024
#: The ``output_config.effort`` levels chat templates know (gpt-oss's ``reasoning_effort``).
TEMPLATE_EFFORTS = ("low", "medium", "high")
#: The prefix of a ``tool_result`` marked ``is_error`` in the tool turn the template renders.
ERROR_RESULT_PREFIX = "Error: "


@attrs.frozen(kw_only=True)
class ToolPlan:
    """What a Messages body asks of tool calling and thinking, checked."""

    tools: tuple[dict[str, Any], ...] | None
    template_kwargs: dict[str, Any]
    constraint: ConstraintSpec | None
    #: How the reply is parsed (None: its text is the one text block).
    output: OutputSpec | None
    #: ``thinking.budget_tokens`` as a generation limit (None: no budget, or no thinking block).
    thinking_budget: ThinkingBudget | None = None


def tool_plan(
    body: schemas.MessagesBody | schemas.CountTokensBody, output: OutputFormat, markers: MarkerIds | None = None
) -> ToolPlan:
    """``markers``: the token ids of the model's thinking block's (start, end) markers."""
    tools = _function_tools(body.tools or [])
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, schemas.NoneChoice | schemas.AutoChoice) and not tools:
        raise InvalidRequestError("tool_choice: a tool choice needs tools.", param="tool_choice")
    parallel = not getattr(choice, "disable_parallel_tool_use", None)
    parse_calls = bool(tools) and not isinstance(choice, schemas.NoneChoice)
    forced = isinstance(choice, schemas.AnyChoice | schemas.NamedChoice)
    if parse_calls and not forced and output.tool_parser is None:
        raise InvalidRequestError(
            "tools: this model has no tool parser, so tool calls cannot be read from its output: set "
            '[model] tool_parser (e.g. hermes), or send tool_choice {"type": "none"}, "any" or "tool".',
            param="tools",
        )
    markup = forced_call_format(output.tool_parser) if forced else output.tool_parser
    constraint = _forced(tools, choice, markup, parallel=parallel)
    json_format = _format_constraint(body.output_config)
    if json_format is not None and constraint is not None:
        raise InvalidRequestError(
            "output_config.format: a JSON output format cannot be combined with forced tool use "
            '(tool_choice "any" or "tool").',
            param="output_config.format",
        )
    constraint = constraint or json_format
    if isinstance(choice, schemas.NamedChoice):
        parallel = False
    spec = None
    tool_parser = markup if parse_calls else None
    if tool_parser is not None or output.reasoning_parser is not None:
        spec = OutputSpec(
            tool_parser=tool_parser, reasoning_parser=output.reasoning_parser, tools=tools or None, parallel=parallel
        )
    template_kwargs = {**_thinking_kwargs(body), **_effort_kwargs(body.output_config)}
    return ToolPlan(
        tools=tools or None,
        template_kwargs=template_kwargs,
        constraint=constraint,
        output=spec,
        thinking_budget=_budget(body.thinking, markers),
    )


def _function_tools(tools: list[schemas.Tool]) -> tuple[dict[str, Any], ...]:
    names: set[str] = set()
    functions = []
    for i, tool in enumerate(tools):
        if not tool.name or tool.name in names:
            raise InvalidRequestError(f"tools.{i}.name: tool names must be non-empty and unique.", param=f"tools.{i}")
        names.add(tool.name)
        function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        functions.append({"type": "function", "function": function})
    return tuple(functions)


def _forced(
    tools: tuple[dict[str, Any], ...], choice: Any, tool_parser: str | None, *, parallel: bool
) -> ConstraintSpec | None:
    if isinstance(choice, schemas.AnyChoice):
        allowed = tools
    elif isinstance(choice, schemas.NamedChoice):
        allowed = tuple(tool for tool in tools if tool["function"]["name"] == choice.name)
        if not allowed:
            raise InvalidRequestError(
                f"tool_choice.name: {choice.name!r:.80} is not one of the tools given.", param="tool_choice.name"
            )
        parallel = False
    else:
        return None
    return ConstraintSpec(
        kind="tool_calls", body=canonical_json(list(allowed)), tool_call_format=tool_parser, parallel=parallel
    )


def _format_constraint(config: schemas.OutputConfig | None) -> ConstraintSpec | None:
    """``output_config.format`` (a JSON schema) as the grammar constraint the chat route's
    ``response_format`` json_schema becomes."""
    if config is None or config.format is None:
        return None
    return ConstraintSpec(kind="json_schema", body=canonical_json(config.format.schema))


def _effort_kwargs(config: schemas.OutputConfig | None) -> dict[str, Any]:
    """``output_config.effort`` as the template variable ``reasoning_effort`` (as the chat
    route passes vLLM's ``reasoning_effort``); levels above ``high`` exist in no template."""
    effort = None if config is None else config.effort
    if effort is None:
        return {}
    if effort not in TEMPLATE_EFFORTS:
        raise InvalidRequestError(
            f"output_config.effort: {effort!r} has no meaning here; chat templates know {', '.join(TEMPLATE_EFFORTS)}.",
            param="output_config.effort",
        )
    return {"reasoning_effort": effort}


def _budget(thinking: schemas.Thinking | None, markers: MarkerIds | None) -> ThinkingBudget | None:
    """The budget to enforce; none for a model without a thinking block (nothing to bound)."""
    if not isinstance(thinking, schemas.ThinkingEnabled) or markers is None:
        return None
    start_ids, end_ids = markers
    return ThinkingBudget(budget=thinking.budget_tokens, start_ids=start_ids, end_ids=end_ids)


def marker_ids(tokenizer: Any, markers: tuple[str, str] | None) -> MarkerIds | None:
    """The thinking markers as token ids (one special token or several plain ones)."""
    if markers is None:
        return None
    start, end = (tuple(tokenizer.encode(marker, add_special_tokens=False)) for marker in markers)
    return (start, end) if start and end else None


def _thinking_kwargs(body: schemas.MessagesBody | schemas.CountTokensBody) -> dict[str, Any]:
    thinking = body.thinking
    if thinking is None:
        return {}
    if isinstance(thinking, schemas.ThinkingDisabled):
        return {"enable_thinking": False}
    if isinstance(thinking, schemas.ThinkingAdaptive):
        return {"enable_thinking": True}  # the model decides how long: no budget to check
    budget = thinking.budget_tokens
    max_tokens = getattr(body, "max_tokens", None)
    if budget < MIN_THINKING_BUDGET or (max_tokens is not None and budget >= max_tokens):
        raise InvalidRequestError(
            f"thinking.budget_tokens: must be at least {MIN_THINKING_BUDGET} and less than max_tokens.",
            param="thinking.budget_tokens",
        )
    return {"enable_thinking": True}


def tool_arguments(block: schemas.ToolUseBlock) -> str:
    """A ``tool_use`` block's ``input`` as the JSON text an OpenAI call carries."""
    return json.dumps(block.input, ensure_ascii=False)


def tool_result_content(
    block: schemas.ToolResultBlock, image: Callable[[schemas.ImageBlock], ImagePart]
) -> ToolContent:
    """A ``tool_result``'s content as the tool turn's: text, or text and image parts (images go
    the way of a user turn's: the model takes them, or admission refuses them with a 400)."""
    content = block.content
    prefix = ERROR_RESULT_PREFIX if block.is_error else ""
    if content is None or isinstance(content, str):
        return prefix + (content or "")
    if not any(isinstance(part, schemas.ImageBlock) for part in content):
        return prefix + "\n".join(part.text for part in content if isinstance(part, schemas.TextBlock))
    parts: list[TextPart | ImagePart] = [TextPart(text=prefix)] if prefix else []
    for part in content:
        parts.append(image(part) if isinstance(part, schemas.ImageBlock) else TextPart(text=part.text))
    return tuple(parts)
