"""The declared request schemas: the shapes that come next decode, are refused while not
honoured (naming the field), and msgspec's errors are worded as the server always worded them."""

from __future__ import annotations

import msgspec
import pytest

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.http.model_names import ServedNames
from vllm_mlx_trio.http.openai import schemas
from vllm_mlx_trio.http.openai.requests import parse_chat, parse_completion
from vllm_mlx_trio.messages import ImagePart, TextPart, VideoPart
from vllm_mlx_trio.testing.requests import MODEL, chat_body

USER = {"role": "user", "content": "hi"}


def parsed_chat(**fields):
    return parse_chat(chat_body(**fields), model_names=ServedNames((MODEL,)), max_n=8)


def refused(parse=parse_chat, **fields) -> InvalidRequestError:
    body = {"model": MODEL, **({"messages": [USER]} if parse is parse_chat else {"prompt": "p"}), **fields}
    with pytest.raises(InvalidRequestError) as info:
        parse(body, model_names=ServedNames((MODEL,)), max_n=8)
    return info.value


NEXT_SHAPES = {
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "chat_template_kwargs": {"enable_thinking": False},
    "reasoning_effort": "low",
}


@pytest.mark.parametrize("field", sorted(NEXT_SHAPES))
def test_the_agent_shapes_decode_and_are_refused_on_completions(field):
    # Chat honours them now (tests/agent/); completions take no tools and no template kwargs.
    decoded = msgspec.convert({"model": MODEL, field: NEXT_SHAPES[field]}, schemas.ChatBody)
    assert getattr(decoded, field) is not None  # a well-formed value is a declared shape
    error = refused(parse_completion, **{field: NEXT_SHAPES[field]})
    assert error.param == field and error.code in ("unsupported_parameter", "unknown_parameter")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tool_choice", "auto"),
        ("tools", {"type": "function"}),
        ("reasoning_effort", "extreme"),
        ("chat_template_kwargs", []),
    ],
)
def test_malformed_agent_fields_name_the_field(field, value):
    error = refused(**{field: value})
    assert error.param == field and error.code is None


def test_off_values_are_accepted():
    parsed = parsed_chat(
        response_format={"type": "text"},
        tools=[],
        tool_choice="none",
        parallel_tool_calls=False,
        best_of=1,
        echo=False,
        suffix=None,
        chat_template_kwargs={},
        reasoning_effort=None,
    )
    assert parsed.prompt[0].content == (TextPart(text="hi"),)


@pytest.mark.parametrize("field", ["chat_template_kwargs", "reasoning_effort"])
def test_chat_only_fields_are_unknown_on_completions(field):
    error = refused(parse_completion, **{field: None})
    assert (str(error), error.code) == (f"Unrecognized request argument supplied: {field}", "unknown_parameter")


def test_content_parts_become_text_and_media_references():
    url = "data:image/png;base64,iVBORw0KGgo="
    message = {
        "role": "user",
        "content": [
            {"type": "text", "text": "look "},
            {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
            {"type": "video_url", "video_url": {"url": "file:///clip.mp4"}},
        ],
    }
    parsed = parse_chat({"model": MODEL, "messages": [message]}, model_names=ServedNames((MODEL,)), max_n=8)
    text, image, video = parsed.prompt[0].content
    assert text == TextPart(text="look ")
    assert isinstance(image, ImagePart) and image.ref == url and len(image.content_hash) == 64
    assert isinstance(video, VideoPart) and video.ref == "file:///clip.mp4"
    again = (
        parse_chat({"model": MODEL, "messages": [message]}, model_names=ServedNames((MODEL,)), max_n=8)
        .prompt[0]
        .content[1]
    )
    assert again.content_hash == image.content_hash  # same media, same prefix-cache key
    assert parsed.prompt[0].text is None


def test_input_audio_is_refused_for_now_with_the_part_path():
    part = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    error = refused(messages=[USER, {"role": "user", "content": [{"type": "text", "text": "x"}, part]}])
    assert error.param == "messages[1].content[1]"
    assert str(error) == "messages[1].content[1]: content part of type 'input_audio' is not supported by this model."


@pytest.mark.parametrize(
    ("fields", "message", "param"),
    [
        ({"max_tokens": "3"}, "max_tokens must be an integer, got str.", "max_tokens"),
        ({"temperature": True}, "temperature must be a number, got bool.", "temperature"),
        ({"temperature": 10**400}, "temperature must be a number, got int.", "temperature"),
        ({"stream": 1}, "stream must be a boolean, got int.", "stream"),
        ({"user": []}, "user must be a string, got list.", "user"),
        ({"stop": [1]}, "stop must be a string or an array of strings.", "stop"),
        (
            {"stream": True, "stream_options": {"include_usage": 1}},
            "stream_options.include_usage must be a boolean, got int.",
            "stream_options.include_usage",
        ),
        ({"logit_bias": {"5": "x"}}, "logit_bias must be a number, got str.", "logit_bias"),
        (
            {"messages": [USER, {"role": "user", "content": "x", "\udfff": 1}]},
            "Unrecognized field in messages[1]: '\\udfff'",
            "messages[1].\udfff",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "\ud800"}]}]},
            "messages[0].content[0]: content part of type '\\ud800' is not supported by this model.",
            "messages[0].content[0]",
        ),
        (
            {"messages": [{"role": "user", "content": "x", "name": ""}]},
            "messages[0].name must be a string of 1 to 256 characters.",
            "messages[0].name",
        ),
    ],
)
def test_msgspec_errors_in_our_words(fields, message, param):
    error = refused(**fields)
    assert (str(error), error.param) == (message, param)


def test_big_ints_reach_the_range_checks_unchanged():
    assert parsed_chat(max_tokens=10**40).params.max_tokens == 10**40  # refused by admission, value quoted


def test_field_kinds_come_from_the_declarations():
    assert schemas.field_kind(schemas.ChatBody, "logprobs") is bool
    assert schemas.field_kind(schemas.CompletionBody, "logprobs") is int
    assert schemas.field_kind(schemas.ChatBody, "messages") is None
