"""response_format, structured_outputs and guided_* as ConstraintSpec (HTTP parsing only)."""

from __future__ import annotations

import json

import pytest

from vllm_mlx_trio.core.constraint import ConstraintSpec
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.openai.requests import parse_chat, parse_completion

MODEL = "m"
SCHEMA = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}


def constraint(parse=parse_chat, **fields) -> ConstraintSpec | None:
    body = {
        "model": MODEL,
        **({"messages": [{"role": "user", "content": "hi"}]} if parse is parse_chat else {"prompt": "p"}),
        **fields,
    }
    return parse(body, model_names=ServedNames((MODEL,)), max_n=8).params.constraint


def refused(**fields) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        constraint(**fields)
    return info.value


@pytest.mark.parametrize(
    ("fields", "kind", "body"),
    [
        ({"response_format": {"type": "json_object"}}, "json_object", ""),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA, "strict": True},
                }
            },
            "json_schema",
            '{"type":"object","properties":{"b":{"type":"string"},"a":{"type":"integer"}}}',
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "json_object", ""),
        ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_json": json.dumps(SCHEMA)}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"guided_regex": "a+"}, "regex", "a+"),
        ({"guided_choice": ["x", "é"]}, "choice", '["x", "é"]'),
        ({"guided_grammar": 'start: "a"'}, "grammar", 'start: "a"'),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"structured_outputs": {"regex": "b+"}}, "regex", "b+"),
        ({"structured_outputs": {"choice": ["y"]}}, "choice", '["y"]'),
        ({"structured_outputs": {"grammar": 'start: "b"'}}, "grammar", 'start: "b"'),
    ],
)
def test_each_field_becomes_its_constraint(fields, kind, body):
    assert constraint(**fields) == ConstraintSpec(kind=kind, body=body)


def test_text_and_nothing_are_no_constraint():
    assert constraint() is None
    assert constraint(response_format={"type": "text"}) is None


def test_completions_take_them_too():
    assert constraint(parse_completion, guided_regex="a+") == ConstraintSpec(kind="regex", body="a+")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"response_format": {"type": "json_object"}, "guided_json": SCHEMA}, "guided_json"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
        ({"guided_regex": "a", "guided_grammar": "start: a"}, "guided_grammar"),
    ],
)
def test_more_than_one_constraint_is_a_400_naming_the_second(fields, param):
    error = refused(**fields)
    assert error.param == param and "Only one output constraint" in str(error)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_json": "[1]"}, "guided_json"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"structured_outputs": {"yaml": "a"}}, "structured_outputs"),
        ({"guided_choice": "yes"}, "guided_choice"),
    ],
)
def test_malformed_fields_are_400s_naming_them(fields, param):
    assert refused(**fields).param == param
