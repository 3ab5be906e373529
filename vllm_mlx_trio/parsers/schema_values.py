"""Typing argument values that the markup carries as strings (qwen3_coder, glm45) by the tool's JSON schema."""

from __future__ import annotations

import ast
import json
from typing import Any

_NOT = object()
#: Type names tool schemas use that are not JSON Schema's (Python's, C's), read as the JSON type they mean.
_TYPE_ALIASES = {
    "float": "number",
    "double": "number",
    "int": "integer",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
    "str": "string",
    "text": "string",
}


def schema_types(schema: dict | None) -> list[str]:
    """The JSON types a property's schema allows (``type``, lists of types, ``anyOf``/``oneOf``)."""
    if not isinstance(schema, dict):
        return []
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else [t for t in declared or () if isinstance(t, str)]
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types.extend(schema_types(option))
    if not types and "enum" in schema:
        types = ["string"] if all(isinstance(v, str) for v in schema["enum"]) else []
    return [_TYPE_ALIASES.get(kind.lower(), kind.lower()) for kind in types]


def _as_type(text: str, kind: str) -> Any:
    stripped = text.strip()
    if kind == "null":
        return None if stripped.lower() in ("null", "none") else _NOT
    if kind == "boolean":
        return {"true": True, "false": False}.get(stripped.lower(), _NOT)
    if kind in ("integer", "number"):
        try:
            number = float(stripped)
        except ValueError:
            return _NOT
        if number.is_integer() and "." not in stripped and "e" not in stripped.lower():
            return int(stripped)
        return number if kind == "number" or number.is_integer() else _NOT
    if kind in ("object", "array"):
        value = _loose_json(stripped)
        expected = dict if kind == "object" else list
        return value if isinstance(value, expected) else _NOT
    return _NOT


def _loose_json(text: str) -> Any:
    """JSON, or a Python literal (models sometimes write ``{'a': 1}``), else _NOT."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _NOT


def coerce_value(text: str, schema: dict | None, *, untyped_as_json: bool) -> Any:
    """The value ``text`` stands for under ``schema``.

    With no type in the schema: the text itself, or (``untyped_as_json``) its JSON value when it
    is one. A value that fits none of the declared types stays the string the model wrote.
    """
    types = schema_types(schema)
    if not types:
        if untyped_as_json:
            value = _loose_json(text.strip())
            return text if value is _NOT else value
        return text
    for kind in types:
        if kind != "string":
            value = _as_type(text, kind)
            if value is not _NOT:
                return value
    return text


def property_schema(function: dict | None, name: str) -> dict | None:
    """The schema of parameter ``name`` of a tool's ``function`` object, if it declares one."""
    if not function:
        return None
    properties = (function.get("parameters") or {}).get("properties") or {}
    schema = properties.get(name)
    return schema if isinstance(schema, dict) else None
