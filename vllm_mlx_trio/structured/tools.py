"""Forced tool calls (``tool_choice`` required or named) as a Lark grammar (the XML-style
markups, whose arguments are tags, in ``xml_calls.py``).

Each callable tool is one alternative: a ``%json`` object whose ``name`` is that tool's name
and whose arguments follow its ``parameters`` schema, wrapped in the markup of the model's
tool parser (``ConstraintSpec.tool_call_format``; none given: ``hermes``, the demo model's).
``parallel=False`` allows exactly one call; otherwise one or more.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..core.constraint import ConstraintSpec
from ..errors import InvalidRequestError
from .xml_calls import XML_MARKUP, xml_calls_lark

#: Tool-call JSON is written as chat templates write it (Python's ``json.dumps``), never with free whitespace.
TOOL_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: The markup used when the spec names no tool parser.
DEFAULT_TOOL_CALL_FORMAT = "hermes"


@attrs.frozen
class CallMarkup:
    """How one parser's calls look: ``before`` + call (``between`` call)* + ``after``; each
    call is ``call_open`` + JSON object + ``call_close``, arguments under ``arguments_key``."""

    before: str
    after: str
    between: str
    call_open: str
    call_close: str
    arguments_key: str = "arguments"


CALL_MARKUP: dict[str, CallMarkup] = {
    # Qwen / Hermes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block per call.
    "hermes": CallMarkup(before="", after="", between="\n", call_open="<tool_call>\n", call_close="\n</tool_call>"),
    # Llama 3.x JSON tool calling: a bare JSON object per call, "parameters" holding the arguments.
    "llama3_json": CallMarkup(
        before="", after="", between="; ", call_open="", call_close="", arguments_key="parameters"
    ),
    # Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...].
    "mistral": CallMarkup(before="[TOOL_CALLS][", after="]", between=", ", call_open="", call_close=""),
}
TOOL_CALL_FORMATS: tuple[str, ...] = (*CALL_MARKUP, *XML_MARKUP)
#: The markup forced calls take where no grammar is written for the model's own (deepseek_v3,
#: openai, kimi_k2) and on a model with no tool parser: bare JSON objects
#: ``{"name", "parameters"}``, read back by the llama3_json parser (vLLM forces JSON too when
#: no parser is set).
FALLBACK_CALL_FORMAT = "llama3_json"


def forced_call_format(tool_parser: str | None) -> str:
    """The markup a request's forced calls are generated (and parsed) in."""
    return tool_parser if tool_parser in TOOL_CALL_FORMATS else FALLBACK_CALL_FORMAT


def tool_calls_lark(spec: ConstraintSpec) -> str:
    """The Lark grammar whose sentences are the calls ``spec`` allows."""
    name = spec.tool_call_format or DEFAULT_TOOL_CALL_FORMAT
    if name in XML_MARKUP:
        return xml_calls_lark(XML_MARKUP[name], _tools(spec.body), parallel=spec.parallel)
    markup = CALL_MARKUP.get(name)
    if markup is None:
        known = ", ".join(TOOL_CALL_FORMATS)
        raise InvalidRequestError(
            f"tool_choice cannot be enforced for tool parser {name!r}: forced tool calls support {known}.",
            param="tool_choice",
        )
    tools = _tools(spec.body)
    rules = [
        _rule(
            "start",
            _lit(markup.before),
            "call",
            f"({_lit(markup.between)} call)*" if spec.parallel else "",
            _lit(markup.after),
        ),
        "call: " + " | ".join(f"tool_{i}" for i in range(len(tools))),
    ]
    for i, (tool_name, parameters) in enumerate(tools):
        schema = _call_schema(tool_name, parameters, markup)
        rules.append(_rule(f"tool_{i}", _lit(markup.call_open), f"%json {schema}", _lit(markup.call_close)))
    return "\n".join(rules) + "\n"


def _rule(name: str, *parts: str) -> str:
    return f"{name}: " + " ".join(part for part in parts if part)


def _lit(text: str) -> str:
    """A Lark string literal (nothing for the empty string, which Lark has no literal for)."""
    return json.dumps(text) if text else ""


def _call_schema(name: str, parameters: dict[str, Any], markup: CallMarkup) -> str:
    schema = {
        "type": "object",
        "properties": {"name": {"const": name}, markup.arguments_key: parameters},
        "required": ["name", markup.arguments_key],
        "additionalProperties": False,
        "x-guidance": TOOL_JSON_OPTIONS,
    }
    return json.dumps(schema)


def _tools(body: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, parameters schema) of each OpenAI tool object in ``body`` (a JSON list)."""
    try:
        tools = json.loads(body)
    except ValueError as exc:
        raise InvalidRequestError(f"tools is not valid JSON: {exc}", param="tools") from exc
    if not isinstance(tools, list) or not tools:
        raise InvalidRequestError("tool_choice requires at least one tool to call.", param="tool_choice")
    out = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"tools[{i}].function.name must be a non-empty string.", param=f"tools[{i}]")
        parameters = function.get("parameters")
        if parameters is None:
            parameters = {"type": "object"}
        if not isinstance(parameters, dict):
            raise InvalidRequestError(
                f"tools[{i}].function.parameters must be a JSON schema object.", param=f"tools[{i}]"
            )
        out.append((name, parameters))
    return out
