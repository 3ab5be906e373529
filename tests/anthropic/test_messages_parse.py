"""Messages bodies onto the engine's turns and params (the parse alone; the real-model tests show
them at work): ``output_config`` (``format`` the json_schema grammar, ``effort`` the template's
``reasoning_effort``), images in user turns and tool results."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.http.anthropic.translate import parse_count_tokens, parse_messages
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.messages import ImagePart
from vllm_mlx_trio.output_format import OutputFormat

MODEL = "m"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def parse(**fields):
    body = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_messages(body, model_names=ServedNames((MODEL,)), output=OutputFormat())


def test_format_becomes_the_json_schema_constraint_and_effort_the_template_variable():
    parsed = parse(output_config={"format": {"type": "json_schema", "schema": SCHEMA}, "effort": "medium"})
    assert parsed.params.constraint.kind == "json_schema"
    assert '"ok"' in parsed.params.constraint.body
    assert dict(parsed.prompt.template_kwargs) == {"reasoning_effort": "medium"}
    assert parse().params.constraint is None and not parse().prompt.template_kwargs


def test_count_tokens_renders_effort_too():
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "output_config": {"effort": "high"}}
    prompt, prefill = parse_count_tokens(body, model_names=ServedNames((MODEL,)), output=OutputFormat())
    assert dict(prompt.template_kwargs) == {"reasoning_effort": "high"} and not prefill


@pytest.mark.parametrize(
    ("config", "param"),
    [
        ({"effort": "xhigh"}, "output_config.effort"),
        ({"format": {"type": "json_schema"}}, "output_config.format.schema"),
        ({"format": {"type": "text"}}, "output_config.format.type"),
        ({"task_budget": 5}, "output_config.task_budget"),
    ],
)
def test_what_has_no_meaning_here_is_a_400_naming_the_field(config, param):
    with pytest.raises(InvalidRequestError) as caught:
        parse(output_config=config)
    assert caught.value.param == param


def test_images_in_user_turns_and_tool_results_are_image_parts():
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    messages = [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "is_error": True,
                    "content": [{"type": "text", "text": "seen"}, {"type": "image", "source": png}],
                }
            ],
        },
    ]
    turns = parse(messages=messages).prompt.messages
    assert [turn.role for turn in turns] == ["user", "assistant", "tool"]
    assert isinstance(turns[0].content[0], ImagePart) and turns[0].content[0].ref == "https://x/a.png"
    error, text, image = turns[2].content
    assert (error.text, text.text) == ("Error: ", "seen")
    assert isinstance(image, ImagePart) and image.ref == "data:image/png;base64,iVBORw0KGgo="
    assert [part.kind for _, part in turns[2].media] == ["image_url"]
