"""Arguments streamed as they are generated (hermes, llama3_json, mistral): fragments, and the
calls sent whole after."""

from __future__ import annotations

import json
import logging

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
