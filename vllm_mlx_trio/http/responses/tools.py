"""Responses tool calling, structured output and reasoning onto the engine: the output parsers and grammar
constraints the chat route uses.

Function, custom and namespace tools become the OpenAI chat tools the template renders
(:mod:`.tool_kinds`; hosted tools are left out); ``tool_choice`` means what it means on the chat route (``auto``: parsed
with the model's tool parser, a 400 without one; ``required`` / ``{"type": "function",
"name"}``: forced by a grammar; ``none``: rendered, never parsed); ``{"type": "custom",
"name"}`` makes the whole reply that custom tool's input, held to its grammar if it has one; ``parallel_tool_calls:
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
from ...structured.tools import forced_call_format
from ..agent_output import OutputSpec
from . import schemas
from .tool_kinds import HOSTED_TOOL_TYPES, DeclaredTools, ToolRoute, declared_tools


@attrs.frozen(kw_only=True)
class ResponsesPlan:
    tools: tuple[dict[str, Any], ...] | None
    template_kwargs: dict[str, Any]
    constraint: ConstraintSpec | None
    output: OutputSpec | None
    #: Each rendered tool name's route back to a call item (custom tools, namespaces).
    routes: dict[str, ToolRoute] = attrs.field(factory=dict)
    #: ``tool_choice`` forces this custom tool: the whole reply is its input.
    forced_custom: ToolRoute | None = None


def _bad(param: str, message: str, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(f"{param}: {message}", param=param, code=code)


def responses_plan(body: schemas.ResponsesBody, output: OutputFormat) -> ResponsesPlan:
    declared = declared_tools(body.tools or [])
    tools = declared.functions
    choice = body.tool_choice
    parallel = body.parallel_tool_calls is not False
    if choice not in (None, "auto", "none") and not tools:
        raise _bad("tool_choice", "a tool choice other than auto or none needs tools.")
    forced_custom = _forced_custom(choice, declared)
    parse_calls = bool(tools) and choice != "none" and forced_custom is None
    forced = choice not in (None, "auto", "none") and forced_custom is None
    if parse_calls and not forced and output.tool_parser is None:
        raise _bad(
            "tools",
            "this model has no tool parser, so tool calls cannot be read from its output: set "
            '[model] tool_parser (e.g. hermes), or send tool_choice "none", "required" or a named function.',
        )
    markup = forced_call_format(output.tool_parser) if forced else output.tool_parser
    if forced_custom is not None:
        constraint = _custom_constraint(forced_custom)
    else:
        constraint, parallel = _forced(tools, choice, markup, parallel)
    format_constraint = _format_constraint(body.text)
    if constraint is not None and format_constraint is not None:
        raise _bad("text.format", "structured output cannot be combined with a forced tool call.")
    kwargs: dict[str, Any] = {}
    if body.reasoning is not None and body.reasoning.effort is not None:
        kwargs["reasoning_effort"] = body.reasoning.effort
    tool_parser = markup if parse_calls else None
    spec = None
    if tool_parser is not None or output.reasoning_parser is not None:
        spec = OutputSpec(
            tool_parser=tool_parser, reasoning_parser=output.reasoning_parser, tools=tools or None, parallel=parallel
        )
    return ResponsesPlan(
        tools=tools or None,
        template_kwargs=kwargs,
        constraint=constraint or format_constraint,
        output=spec,
        routes=declared.routes,
        forced_custom=forced_custom,
    )


def _forced_custom(choice: Any, declared: DeclaredTools) -> ToolRoute | None:
    if not isinstance(choice, dict) or choice.get("type") != "custom":
        return None
    if set(choice) != {"type", "name"}:
        raise _bad("tool_choice", 'a custom tool choice is {"type": "custom", "name": ...}.')
    for route in declared.routes.values():
        if route.kind == "custom" and route.namespace is None and route.name == choice["name"]:
            return route
    raise _bad("tool_choice", f"names custom tool {choice['name']!r:.80}, which is not one of the tools given.")


def _custom_constraint(route: ToolRoute) -> ConstraintSpec | None:
    """A forced custom tool's grammar over the whole reply (none for a free-text tool)."""
    if route.grammar is None:
        return None
    kind = "grammar" if route.grammar["syntax"] == "lark" else "regex"
    return ConstraintSpec(kind=kind, body=route.grammar["definition"])


def _forced(
    tools: tuple[dict[str, Any], ...], choice: Any, tool_parser: str | None, parallel: bool
) -> tuple[ConstraintSpec | None, bool]:
    if choice == "required":
        allowed = tools
    elif isinstance(choice, dict):
        name = choice.get("name")
        if choice.get("type") in HOSTED_TOOL_TYPES:
            raise _bad("tool_choice.type", f"{choice['type']!r} is a hosted tool, which this server does not run.")
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
