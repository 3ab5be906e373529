"""Responses tool calling, structured output and reasoning onto the engine: the output parsers and grammar
constraints the chat route uses.

Function tools (``{"type": "function", "name", "parameters"}``) become the OpenAI chat tools
the template renders; ``tool_choice`` means what it means on the chat route (``auto``: parsed
with the model's tool parser, a 400 without one; ``required`` / ``{"type": "function",
"name"}``: forced by a grammar; ``none``: rendered, never parsed); ``parallel_tool_calls:
false`` allows one call. ``text.format`` ``json_schema`` / ``json_object`` constrain the
reply with a grammar (not together with forced calls); ``reasoning.effort`` reaches the
template as ``reasoning_effort``, as the chat route passes it.
"""

from __future__ import annotations

from typing import Any

import attrs

from ...core.constraint import ConstraintSpec, canonical_json
from ...errors import InvalidRequestError
from ...output_format import OutputFormat
from ..agent_output import OutputSpec
from . import schemas


@attrs.frozen(kw_only=True)
class ResponsesPlan:
    tools: tuple[dict[str, Any], ...] | None
    template_kwargs: dict[str, Any]
    constraint: ConstraintSpec | None
    output: OutputSpec | None


def _bad(param: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param, code=code)


def responses_plan(body: schemas.ResponsesBody, output: OutputFormat) -> ResponsesPlan:
    tools = _function_tools(body.tools or [])
    choice = body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if choice not in (None, "auto", "none") and not tools:
        raise _bad("tool_choice", "a tool choice other than auto or none needs tools.")
    parse_calls = bool(tools) and choice != "none"
    if parse_calls and output.tool_parser is None:
        raise _bad(
            "tools",
            "this model has no tool parser, so tool calls cannot be read from its output: set "
            '[model] tool_parser (e.g. hermes), or send tool_choice "none".',
        )
    constraint, parallel = _forced(tools, choice, output.tool_parser, parallel)
    format_constraint = _format_constraint(body.text)
    if constraint is not None and format_constraint is not None:
        raise _bad("text.format", "structured output cannot be combined with a forced tool call.")
    kwargs: dict[str, Any] = {}
    if body.reasoning is not None and body.reasoning.effort is not None:
        kwargs["reasoning_effort"] = body.reasoning.effort
    tool_parser = output.tool_parser if parse_calls else None
    spec = None
    if tool_parser is not None or output.reasoning_parser is not None:
        spec = OutputSpec(
            tool_parser=tool_parser, reasoning_parser=output.reasoning_parser, tools=tools or None, parallel=parallel
        )
    return ResponsesPlan(
        tools=tools or None, template_kwargs=kwargs, constraint=constraint or format_constraint, output=spec
    )


def _function_tools(tools: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    names: set[str] = set()
    functions = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type")
        if kind != "function":
            raise _bad(
                f"{where}.type",
                f"only function tools are supported by this server, not {kind!r:.60}.",
                "unsupported_parameter",
            )
        unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
        if unknown:
            raise _bad(f"{where}.{sorted(unknown)[0]}", "unrecognized field.", "unknown_parameter")
        name = tool.get("name")
        if not isinstance(name, str) or not name or name in names:
            raise _bad(f"{where}.name", "function names must be non-empty, unique strings.")
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise _bad(f"{where}.parameters", "must be a JSON schema object.")
        names.add(name)
        function = {"name": name, "parameters": parameters}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        functions.append({"type": "function", "function": function})
    return tuple(functions)


def _forced(
    tools: tuple[dict[str, Any], ...], choice: Any, tool_parser: str | None, parallel: bool
) -> tuple[ConstraintSpec | None, bool]:
    if choice == "required":
        allowed = tools
    elif isinstance(choice, dict):
        name = choice.get("name")
        if choice.get("type") != "function" or set(choice) != {"type", "name"}:
            raise _bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "name": ...}.')
        allowed = tuple(tool for tool in tools if tool["function"]["name"] == name)
        if not allowed:
            raise _bad("tool_choice", f"names function {name!r:.80}, which is not one of the tools given.")
        parallel = False
    elif choice in (None, "auto", "none"):
        return None, parallel
    else:
        raise _bad("tool_choice", f"unknown tool choice {choice!r:.60}.")
    spec = ConstraintSpec(
        kind="tool_calls", body=canonical_json(list(allowed)), tool_call_format=tool_parser, parallel=parallel
    )
    return spec, parallel


def _format_constraint(text: schemas.TextConfig | None) -> ConstraintSpec | None:
    fmt = text.format if text is not None else None
    if isinstance(fmt, schemas.JsonSchemaOutputFormat):
        return ConstraintSpec(kind="json_schema", body=canonical_json(fmt.schema))
    if isinstance(fmt, schemas.JsonObjectOutputFormat):
        return ConstraintSpec(kind="json_object", body="")
    return None
