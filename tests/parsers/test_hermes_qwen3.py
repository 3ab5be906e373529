"""hermes tool calls (Qwen 2.5/3) and the qwen3 / deepseek_r1 reasoning parsers."""

from __future__ import annotations

import json
import logging

import pytest

from vllm_mlx_trio.parsers import OutputParser, parse_text, prompt_ends_in_reasoning, reasoning_markers

from .helpers import check_all_chunkings, chunkings, shape, stream

H = {"tool_parser": "hermes", "reasoning_parser": "qwen3"}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
CALL2 = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'


def test_content_before_two_calls():
    check_all_chunkings(
        "Let me check.\n\n" + CALL + "\n" + CALL2,
        ("Let me check.", None, [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"tz": "CET"})]),
        **H,
    )


def test_reasoning_then_call_and_calls_inside_reasoning_are_not_parsed():
    text = "<think>\nI could call " + CALL2 + " maybe\n</think>\n\n" + CALL
    check_all_chunkings(
        text, (None, "I could call " + CALL2 + " maybe", [("get_weather", {"city": "Paris", "days": 2})]), **H
    )


def test_plain_text_passes_through_unchanged():
    text = "  Hello <b>world</b> <tool but no call\n\n"
    check_all_chunkings(text, (text, None, []), tool_parser="hermes", reasoning_parser=None)
    check_all_chunkings(text, (text, None, []), tool_parser=None, reasoning_parser=None)


def test_prompt_opened_the_thinking_block():
    check_all_chunkings(
        "plan it\n</think>\n\nThe answer.", ("The answer.", "plan it", []), starts_in_reasoning=True, **H
    )


def test_output_opening_with_think_and_truncated_reasoning():
    check_all_chunkings("<think>\nstill thinking <tool_call>", (None, "still thinking <tool_call>", []), **H)


def test_deepseek_r1_starts_inside_and_drops_a_repeated_opener():
    kwargs = {"tool_parser": None, "reasoning_parser": "deepseek_r1", "starts_in_reasoning": True}
    check_all_chunkings("<think>\nhmm\n</think>\n\nYes.", ("Yes.", "hmm", []), **kwargs)
    check_all_chunkings("hmm</think>Yes.", ("Yes.", "hmm", []), **kwargs)


def test_stray_closer_is_dropped_from_the_content(caplog):
    with caplog.at_level(logging.WARNING):
        message = parse_text("thought</think>\n\nanswer", **H)
    assert message.content == "thought\n\nanswer" and "</think>" in caplog.text


def test_unparseable_markup_is_content_with_a_warning(caplog):
    for text in (
        'Here: <tool_call>\n{"name": f, "arguments": {"a": 1}}\n</tool_call> done',
        'Here: <tool_call>\n{"arguments": {oops}, "name": "f"}\n</tool_call> done',
        # the arguments do not start as a JSON object does: no call is opened
        'Here: <tool_call>\n{"name": "f", "arguments": {oops}\n</tool_call> done',
    ):
        with caplog.at_level(logging.WARNING):
            check_all_chunkings(text, (text, None, []), **H)
        assert "markup returned as content" in caplog.text


@pytest.mark.parametrize(
    ("text", "kept", "not_sent"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {"a": oops}\n</tool_call> done', '{"a": ', "oops}"),
        ('<tool_call>\n{"name": "f", "arguments": {"a": [1, "x</tool_call>', '{"a": [1, "x', ""),
        ('<tool_call>{"name": "f", "arguments": {"a": 1}} junk</tool_call>', '{"a": 1}', "} junk"),
        ('<tool_call>{"name": "f", "arguments": {"a": 1, "b": ', '{"a": 1, "b": ', ""),
    ],
)
def test_a_call_whose_arguments_began_streaming_keeps_them_when_its_markup_breaks(caplog, text, kept, not_sent):
    """Decision: once the name and the arguments' start were sent, the call stays with what was sent
    (clients hold it already), nothing of the markup reaches the content, and a WARNING logs the markup."""
    args = json.loads(kept) if kept == '{"a": 1}' else "BROKEN:" + kept
    after = "done" if text.endswith(" done") else None
    with caplog.at_level(logging.WARNING):
        check_all_chunkings(text, (after, None, [("f", args)]), **H)
    assert "kept with the" in caplog.text and repr(not_sent)[1:-1] in caplog.text


def test_arguments_stream_as_written_once_the_name_is_known():
    args = '{"city":  "Paris", "note": "a } \\" {", "days": [1, {"x": null}]}'
    text = f'Ok <tool_call>\n{{"name": "get_weather", "arguments": {args}}}\n</tool_call>'
    for chunks in chunkings(text).values():
        deltas, message = stream(chunks, **H)
        pieces = [d for d in deltas if d.tool_index is not None]
        assert pieces[0].tool_name == "get_weather" and pieces[0].arguments == ""
        assert all(d.tool_id is None and d.tool_name is None for d in pieces[1:])
        assert "".join(d.arguments for d in pieces) == args == message.tool_calls[0].arguments
        assert message.content == "Ok"
    one_char = stream(list(text), **H)[0]
    # every character goes out as it comes (the "{" once the next one shows an object starts)
    assert [d.arguments for d in one_char if d.arguments] == ['{"', *args[2:]]


def test_unclosed_call_at_the_end_is_still_a_call():
    check_all_chunkings(
        '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}\n', (None, None, [("f", {"a": [1, 2]})]), **H
    )


def test_content_streams_before_the_call_and_markup_is_held_only_while_partial():
    parser = OutputParser(**H)
    assert [d.content for d in parser.feed("Sure, checking <")] == ["Sure, checking"]
    assert [d.content for d in parser.feed("b> now")] == [" <b> now"]
    deltas, message = stream(["Sure", " <tool", "_call>", '{"name": "f", "arguments": {}}', "</tool_call>"], **H)
    assert [d.content for d in deltas if d.content] == ["Sure"]
    calls = [d for d in deltas if d.tool_index is not None]
    assert [(d.tool_index, d.tool_name, d.arguments) for d in calls] == [(0, "f", ""), (0, None, "{}")]
    assert calls[0].tool_id.startswith("call_") and len(calls[0].tool_id) == 29
    assert shape(message) == ("Sure", None, [("f", {})])


def test_markers_and_prompt_detection():
    assert reasoning_markers("qwen3") == ("<think>", "</think>")
    assert reasoning_markers("deepseek_r1") == ("<think>", "</think>")
    assert prompt_ends_in_reasoning("qwen3", "<|im_start|>assistant\n<think>\n")
    assert not prompt_ends_in_reasoning("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_ends_in_reasoning("qwen3", "<|im_start|>assistant\n")
    with pytest.raises(KeyError):
        reasoning_markers("nope")


def test_unknown_parser_names_are_refused():
    with pytest.raises(ValueError, match="unknown tool parser"):
        OutputParser(tool_parser="nope", reasoning_parser=None)


def test_one_feed_gives_one_delta_per_run_of_the_same_text():
    parser = OutputParser(**H)
    deltas = parser.feed("<think>a</think>b <tool_call>x</tool_call> c")
    deltas += parser.finish()
    assert [(d.reasoning, d.content) for d in deltas] == [("a", ""), ("", "b <tool_call>x</tool_call> c")]
