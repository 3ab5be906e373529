"""Forced tool calls in the XML-style markups whose arguments are not one JSON object:
Qwen3-Coder's ``<function=...><parameter=...>`` and GLM 4.5's ``<arg_key>/<arg_value>``.

Each parameter is its own piece of grammar, in the schema's property order (a required one
once, an optional one at most once): a string value is free text up to the closing tag (a lazy
lexeme whose ``suffix`` is that tag), or one of its ``enum`` strings; any other value is JSON
under its sub-schema (``%json``), as the parsers read it back (``parsers/tag_formats.py`` types
each value by the same schema).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

#: Tool-call JSON values, written as the chat templates write them.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@attrs.frozen
class XmlMarkup:
    """``call_open(name)`` + parameters + ``call_close``; each parameter ``key_open(key)`` +
    value + ``value_close``; calls joined by ``between``."""

    call_open: str
    call_close: str
    key_open: str
    value_close: str
    between: str = "\n"


XML_MARKUP: dict[str, XmlMarkup] = {
    # <tool_call>\n<function=f>\n<parameter=x>\nvalue\n</parameter>\n</function>\n</tool_call>
    "qwen3_coder": XmlMarkup(
        call_open="<tool_call>\n<function={name}>\n",
        call_close="</function>\n</tool_call>",
        key_open="<parameter={key}>\n",
        value_close="\n</parameter>\n",
    ),
    # <tool_call>f\n<arg_key>x</arg_key>\n<arg_value>value</arg_value>\n</tool_call>
    "glm45": XmlMarkup(
        call_open="<tool_call>{name}\n",
        call_close="</tool_call>",
        key_open="<arg_key>{key}</arg_key>\n<arg_value>",
        value_close="</arg_value>\n",
    ),
}


def xml_calls_lark(markup: XmlMarkup, tools: list[tuple[str, dict[str, Any]]], *, parallel: bool) -> str:
    """The Lark grammar of calls of ``tools`` ((name, parameters schema) pairs) in ``markup``."""
    rules = [
        f"start: call ({_lit(markup.between)} call)*" if parallel else "start: call",
        "call: " + " | ".join(f"tool_{i}" for i in range(len(tools))),
    ]
    for i, (name, parameters) in enumerate(tools):
        pieces = []
        for j, (key, schema, required) in enumerate(_parameters(parameters)):
            rules += _parameter_rules(f"p_{i}_{j}", markup, key, schema)
            pieces.append(f"p_{i}_{j}" if required else f"p_{i}_{j}?")
        body = " ".join([_lit(markup.call_open.format(name=name)), *pieces, _lit(markup.call_close)])
        rules.append(f"tool_{i}: {body}")
    return "\n".join(rules) + "\n"


def _parameters(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    return [(key, sub if isinstance(sub, dict) else {}, key in required) for key, sub in properties.items()]


def _parameter_rules(rule: str, markup: XmlMarkup, key: str, schema: dict[str, Any]) -> list[str]:
    opening = _lit(markup.key_open.format(key=key))
    close = markup.value_close
    choices = schema.get("enum")
    if _is_text(schema) and isinstance(choices, list) and all(isinstance(c, str) for c in choices):
        alternatives = " | ".join(_lit(choice) for choice in dict.fromkeys(choices) if choice)
        return [f"{rule}: {opening} ({alternatives}) {_lit(close)}"]
    if _is_text(schema):
        return [f"{rule}: {opening} {rule}_text", f"{rule}_text[suffix={json.dumps(close)}]: /(?s:.*)/"]
    typed = {**schema, "x-guidance": _JSON_OPTIONS}
    return [f"{rule}: {opening} %json {json.dumps(typed)} {_lit(close)}"]


def _is_text(schema: dict[str, Any]) -> bool:
    """Written as raw text: a string, or a value of no declared type (the parsers keep it as text)."""
    kind = schema.get("type")
    return kind == "string" or (kind is None and "enum" not in schema and "properties" not in schema)


def _lit(text: str) -> str:
    return json.dumps(text) if text else ""
