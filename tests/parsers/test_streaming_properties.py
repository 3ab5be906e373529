"""Hypothesis: for any text and any chunking, the streamed deltas add up to the non-streamed message."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_mlx_trio.parsers import REASONING_PARSERS, TOOL_PARSERS, OutputParser, parse_text

from .helpers import from_deltas, shape, stream

#: Pieces of every family's markup, so random texts hit partial and whole markers.
MARKUP = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=f>",
    "<parameter=a>",
    "</parameter>",
    "</function>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|python_tag|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|tool_calls_section_end|>",
    "<|channel|>",
    "<|message|>",
    "<|start|>",
    "<|end|>",
    "<|call|>",
    "analysis",
    "final",
    "commentary to=functions.f ",
    '{"name": "f", "arguments": {"a": 1}}',
    '{"a": [1, "x"]}',
    "f",
    "\n",
    " ",
    "<",
    "|",
    "{",
    "}",
    "text",
    "é",
]

texts = st.lists(st.sampled_from(MARKUP) | st.text(max_size=4), max_size=25).map("".join)
pairs = st.sampled_from([None, *TOOL_PARSERS]), st.sampled_from([None, *REASONING_PARSERS])


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts, st.lists(st.integers(0, 10_000), max_size=30), *pairs, st.booleans())
def test_streamed_equals_whole_for_any_text(text, cuts, tool_parser, reasoning_parser, inside):
    kwargs = {"tool_parser": tool_parser, "reasoning_parser": reasoning_parser, "starts_in_reasoning": inside}
    whole = shape(parse_text(text, **kwargs))
    deltas, message = stream(_split(text, cuts), **kwargs)
    assert shape(message) == whole
    assert from_deltas(deltas) == whole


def _no_markup(s: str) -> bool:
    return not any(ch in s for ch in "<>[]{}|｜") and bool(s.strip())


words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20).filter(
    _no_markup
)
arguments = st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), st.integers() | words | st.booleans())


@settings(max_examples=200, deadline=None)
@given(
    words,
    st.lists(st.tuples(st.from_regex(r"[a-z_]{1,8}", fullmatch=True), arguments), max_size=3),
    st.lists(st.integers(0, 10_000), max_size=30),
)
def test_hermes_calls_survive_any_chunking(content, calls, cuts):
    text = (
        content.strip()
        + "\n" * bool(calls)
        + "".join(
            f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>\n" for name, args in calls
        )
    )
    kwargs = {"tool_parser": "hermes", "reasoning_parser": "qwen3"}
    deltas, message = stream(_split(text, cuts), **kwargs)
    expected = (content.strip(), None, [list(call) for call in calls])
    got = from_deltas(deltas)
    assert (got[0], got[1], [list(call) for call in got[2]]) == expected
    assert shape(message) == got


@settings(max_examples=200, deadline=None)
@given(
    words,
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
    arguments,
    st.sampled_from([None, 2]),
    st.lists(st.integers(0, 10_000), max_size=30),
)
def test_hermes_arguments_stream_as_fragments_that_add_up_to_the_final_json(content, name, args, indent, cuts):
    """Each feed sends the arguments seen so far (a prefix of the final JSON); once the text up to the
    arguments' closing brace is in, all of them are out, before the markup closes."""
    args_text = json.dumps(args, indent=indent)
    head = f'{content.strip()}\n<tool_call>\n{{"name": "{name}", "arguments": '
    text = head + args_text + "}\n</tool_call>"
    args_end = len(head) + len(args_text)
    parser = OutputParser(tool_parser="hermes", reasoning_parser="qwen3")
    sent, fed = "", 0
    for chunk in _split(text, cuts):
        sent += "".join(d.arguments for d in parser.feed(chunk) if d.tool_index is not None)
        fed += len(chunk)
        assert args_text.startswith(sent)
        if fed >= args_end:
            assert sent == args_text
    sent += "".join(d.arguments for d in parser.finish() if d.tool_index is not None)
    assert sent == args_text == parser.message().tool_calls[0].arguments
    assert json.loads(parser.message().tool_calls[0].arguments) == args
