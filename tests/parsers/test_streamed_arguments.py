"""Arguments streamed as they are generated, in every family: fragments, and the
calls sent whole after."""

from __future__ import annotations

import json
import logging

import pytest

from vllm_mlx_trio.parsers import OutputParser

from .helpers import check_all_chunkings, chunkings, stream

ARGS = '{"city": "Paris", "days": [1, 2]}'


def sent_arguments(parser: OutputParser, text: str) -> str:
    return "".join(d.arguments for d in parser.feed(text) if d.tool_index is not None)


def test_llama3_json_arguments_stream_before_the_output_ends():
    for prefix in ("<|python_tag|>", ""):  # tagged, and a bare JSON reply
        parser = OutputParser(tool_parser="llama3_json", reasoning_parser=None)
        sent = sent_arguments(parser, prefix + '{"name": "get_weather", "parameters": {"city": "Pa')
        assert sent == '{"city": "Pa'
        sent += sent_arguments(parser, 'ris", "days": [1, 2]}}')
        assert sent == ARGS
        assert sent_arguments(parser, "<|eom_id|>") == ""
        parser.finish()
        (call,) = parser.message().tool_calls
        assert (call.name, call.arguments, parser.message().content) == ("get_weather", ARGS, None)


def test_llama3_json_calls_after_the_first_are_sent_whole_at_the_end():
    text = f'<|python_tag|>{{"name": "a", "parameters": {ARGS}}}; {{"name": "b", "parameters": {{"x": 1}}}}'
    check_all_chunkings(
        text, (None, None, [("a", json.loads(ARGS)), ("b", {"x": 1})]), tool_parser="llama3_json", reasoning_parser=None
    )
    for chunks in chunkings(text).values():
        deltas, message = stream(chunks, tool_parser="llama3_json", reasoning_parser=None)
        assert [c.arguments for c in message.tool_calls] == [ARGS, '{"x": 1}']
        assert [d.tool_index for d in deltas if d.tool_name] == [0, 1]


def test_llama3_json_broken_after_the_arguments_began_keeps_the_call(caplog):
    text = '<|python_tag|>{"name": "a", "parameters": {"x": 1, "y": '
    with caplog.at_level(logging.WARNING):
        check_all_chunkings(
            text, (None, None, [("a", 'BROKEN:{"x": 1, "y": ')]), tool_parser="llama3_json", reasoning_parser=None
        )
    assert "kept with the" in caplog.text


MISTRAL_V11 = f'[TOOL_CALLS]get_weather[ARGS]{ARGS}[TOOL_CALLS]get_time[CALL_ID]abc123XYZ[ARGS]{{"tz": "CET"}}'
MISTRAL_ARRAY = (
    f'[TOOL_CALLS] [{{"name": "get_weather", "arguments": {ARGS}}}, {{"name": "get_time", "arguments": {{}}}}]'
)


def test_mistral_arguments_stream_before_the_output_ends():
    for prefix in ("[TOOL_CALLS]get_weather[ARGS]", '[TOOL_CALLS] [{"name": "get_weather", "arguments": '):
        parser = OutputParser(tool_parser="mistral", reasoning_parser=None)
        sent = sent_arguments(parser, prefix + '{"city": "Pa')
        assert sent == '{"city": "Pa'
        sent += sent_arguments(parser, 'ris", "days": [1, 2]}')
        assert sent == ARGS
        parser.finish()
        (call, *_) = parser.message().tool_calls
        assert (call.name, call.arguments) == ("get_weather", ARGS)


def test_mistral_v11_calls_each_stream_with_their_own_index_and_id():
    check_all_chunkings(
        MISTRAL_V11,
        (None, None, [("get_weather", json.loads(ARGS)), ("get_time", {"tz": "CET"})]),
        tool_parser="mistral",
        reasoning_parser=None,
    )
    for chunks in chunkings(MISTRAL_V11).values():
        deltas, message = stream(chunks, tool_parser="mistral", reasoning_parser=None)
        assert [c.arguments for c in message.tool_calls] == [ARGS, '{"tz": "CET"}']
        assert [d.tool_index for d in deltas if d.tool_name] == [0, 1]
        assert [d.tool_id for d in deltas if d.tool_name][1] == "abc123XYZ"
    many = [chunk for chunk in chunkings(MISTRAL_V11).values() if len(chunk) > 20][0]
    deltas, _ = stream(many, tool_parser="mistral", reasoning_parser=None)
    assert len([d for d in deltas if d.tool_index == 0 and d.arguments]) > 3  # fragments, not one piece


def test_mistral_array_calls_after_the_first_are_sent_whole_at_the_end():
    check_all_chunkings(
        MISTRAL_ARRAY,
        (None, None, [("get_weather", json.loads(ARGS)), ("get_time", {})]),
        tool_parser="mistral",
        reasoning_parser=None,
    )


def test_mistral_broken_after_the_arguments_began_keeps_the_call(caplog):
    text = '[TOOL_CALLS]a[ARGS]{"x": 1, "y": '
    with caplog.at_level(logging.WARNING):
        check_all_chunkings(
            text, (None, None, [("a", 'BROKEN:{"x": 1, "y": ')]), tool_parser="mistral", reasoning_parser=None
        )
    assert "kept with the" in caplog.text


DAYS_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
]
DS_BEGIN = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
DS_END = "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
KIMI_BEGIN = "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
HARMONY_BEGIN = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"


@pytest.mark.parametrize(
    ("tool_parser", "first", "sent_first", "rest"),
    [
        (
            "qwen3_coder",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n",
            '{"city": "Paris"',
            "3\n</parameter>\n</function>\n</tool_call>",
        ),
        (
            "glm45",
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>",
            '{"city": "Paris"',
            "3</arg_value>\n</tool_call>",
        ),
        ("deepseek_v3", DS_BEGIN + '{"city": "Pa', '{"city": "Pa', 'ris", "days": 3}' + DS_END),
        (
            "kimi_k2",
            KIMI_BEGIN + '{"city": "Pa',
            '{"city": "Pa',
            'ris", "days": 3}<|tool_call_end|><|tool_calls_section_end|>',
        ),
        ("openai", HARMONY_BEGIN + '{"city": "Pa', '{"city": "Pa', 'ris", "days": 3}<|call|>'),
    ],
)
def test_every_family_streams_arguments_before_the_call_ends(tool_parser, first, sent_first, rest):
    parser = OutputParser(tool_parser=tool_parser, reasoning_parser=None, tools=DAYS_TOOLS)
    deltas = parser.feed(first)
    assert [d.tool_name for d in deltas if d.tool_name] == ["get_weather"]
    assert "".join(d.arguments for d in deltas) == sent_first
    deltas += parser.feed(rest) + parser.finish()
    (call,) = parser.message().tool_calls
    assert "".join(d.arguments for d in deltas) == call.arguments == '{"city": "Paris", "days": 3}'
    check_all_chunkings(
        first + rest,
        (None, None, [("get_weather", {"city": "Paris", "days": 3})]),
        tool_parser=tool_parser,
        reasoning_parser=None,
        tools=DAYS_TOOLS,
    )


def test_tag_pairs_stream_as_the_json_that_json_dumps_writes():
    """An untyped Qwen3-Coder value is text: it streams as written (less the newline on each side)."""
    text = (
        '<tool_call>\n<function=f>\n<parameter=a>\nx "q" ü\n</parameter>\n<parameter=b>\n[1, {"c": null}]\n'
        "</parameter>\n</function>\n</tool_call>"
    )
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"b": {"type": "array"}}}}}]
    for name, chunks in chunkings(text).items():
        deltas, message = stream(chunks, tool_parser="qwen3_coder", reasoning_parser=None, tools=tools)
        pieces = [d.arguments for d in deltas if d.tool_index is not None and d.arguments]
        if name == "1":  # a string value as it comes, the array once its closing tag is seen, then the brace
            chars = [json.dumps(ch, ensure_ascii=False)[1:-1] for ch in 'x "q" ü']
            assert pieces == ['{"a": "', *chars, '"', ', "b": [1, {"c": null}]', "}"]
        expected = json.dumps({"a": 'x "q" ü', "b": [1, {"c": None}]}, ensure_ascii=False)
        assert "".join(pieces) == message.tool_calls[0].arguments == expected


def test_a_call_without_arguments_streams_an_empty_object():
    text = (
        "<tool_call>get_time\n</tool_call>"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
    )
    check_all_chunkings(
        text,
        (None, None, [("get_time", {}), ("get_weather", {"city": "Paris"})]),
        tool_parser="glm45",
        reasoning_parser=None,
    )


def test_a_long_string_value_streams_before_its_closing_tag():
    tools = [
        {
            "type": "function",
            "function": {"name": "write", "parameters": {"properties": {"content": {"type": "string"}}}},
        }
    ]
    glm = OutputParser(tool_parser="glm45", reasoning_parser=None, tools=tools)
    sent = sent_arguments(glm, "<tool_call>write\n<arg_key>content</arg_key>\n<arg_value>line 1\nline 2</arg_")
    assert sent == '{"content": "line 1\\nline 2'
    assert sent_arguments(glm, "value>\n</tool_call>") == '"}'
    qwen = OutputParser(tool_parser="qwen3_coder", reasoning_parser=None, tools=tools)
    sent = sent_arguments(qwen, "<tool_call>\n<function=write>\n<parameter=content>\nline 1\n")
    assert sent == '{"content": "line 1'  # the newline may be the tags': held
    sent += sent_arguments(qwen, "line 2\n</parameter>\n</function>\n</tool_call>")
    assert sent == '{"content": "line 1\\nline 2"}'
