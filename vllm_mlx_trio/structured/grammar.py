"""A :class:`ConstraintSpec` as llguidance grammar text (tokenizer-free; checked at compile).

Every grammar is llguidance's JSON form: ``{"grammars": [...]}``. The constrained part is
the grammar named ``body``; when the model thinks first, a Lark top grammar lets the thinking
block (``<think> ... </think>``) come before it: ``start: think? @body``.

JSON is compact and strict about whitespace (``whitespace_flexible = false``): a model, above
all a random-weight one, may otherwise emit whitespace forever without breaking the grammar.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from llguidance import LLMatcher

from ..core.constraint import ConstraintSpec, ReasoningMarkers
from ..errors import InvalidRequestError
from .tools import tool_calls_lark

#: Options for every JSON the grammar builds: no free whitespace.
JSON_OPTIONS = {"whitespace_flexible": False}


def build_grammar(spec: ConstraintSpec, reasoning: ReasoningMarkers | None = None) -> str:
    """The llguidance grammar (JSON text) for ``spec``; raises :class:`InvalidRequestError`
    for a body that is not even of the right shape (the compile finds the rest)."""
    body = dict(_BODY_BUILDERS[spec.kind](spec))
    body["name"] = "body"
    if reasoning is None:
        return json.dumps({"grammars": [body]})
    return json.dumps({"grammars": [{"lark_grammar": reasoning_lark(reasoning)}, body]})


def reasoning_lark(reasoning: ReasoningMarkers) -> str:
    """``start`` = an optional thinking block (or the rest of one already opened), then ``@body``."""
    end = json.dumps(reasoning.end)
    thinking = f"think_text[stop={end}]: /(?s:.*)/\n"
    if reasoning.starts_inside:
        return "start: think_text /[ \\t\\n]*/ @body\n" + thinking
    start = json.dumps(reasoning.start)
    return f"start: think? @body\nthink: {start} think_text /[ \\t\\n]*/\n" + thinking


def _first_grammar(grammar_json: str) -> dict[str, Any]:
    return json.loads(grammar_json)["grammars"][0]


def _json_schema_body(spec: ConstraintSpec) -> dict[str, Any]:
    schema = _load_json(spec.body, "response_format.json_schema.schema")
    if not isinstance(schema, dict):
        raise InvalidRequestError("The JSON schema must be a JSON object.", param="response_format")
    return _first_grammar(LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS))


def _json_object_body(spec: ConstraintSpec) -> dict[str, Any]:
    return _first_grammar(LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS))


def _regex_body(spec: ConstraintSpec) -> dict[str, Any]:
    return _first_grammar(LLMatcher.grammar_from_regex(spec.body))


def _grammar_body(spec: ConstraintSpec) -> dict[str, Any]:
    return {"lark_grammar": spec.body}


def _choice_body(spec: ConstraintSpec) -> dict[str, Any]:
    choices = _load_json(spec.body, "choice")
    if not isinstance(choices, list) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequestError("choice must be a non-empty list of non-empty strings.", param="choice")
    alternatives = " | ".join(json.dumps(c) for c in dict.fromkeys(choices))
    return {"lark_grammar": f"start: {alternatives}\n"}


def _tool_calls_body(spec: ConstraintSpec) -> dict[str, Any]:
    return {"lark_grammar": tool_calls_lark(spec)}


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidRequestError(f"{what} is not valid JSON: {exc}", param=what) from exc


_BODY_BUILDERS: dict[str, Callable[[ConstraintSpec], dict[str, Any]]] = {
    "json_object": _json_object_body,
    "json_schema": _json_schema_body,
    "regex": _regex_body,
    "choice": _choice_body,
    "grammar": _grammar_body,
    "tool_calls": _tool_calls_body,
}
