"""Every tool-call family, whole and streamed in every chunking, against markup as the models write it."""

from __future__ import annotations

import json
import logging

import pytest

from vllm_mlx_trio.parsers import TOOL_PARSERS, OutputParser, parse_text

from .helpers import check_all_chunkings

WEATHER = ("get_weather", {"city": "Paris", "days": 2})
TIME = ("get_time", {"tz": "CET"})
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"properties": {"tz": {"type": "string"}}}}},
]

QWEN3_CODER = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
    "</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\nCET\n</parameter>\n</function>\n"
    "</tool_call>"
)
DS_V3 = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris", "days": 2}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
    '```json\n{"tz": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
DS_V31 = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    '{"city": "Paris", "days": 2}<｜tool▁call▁end｜>'
    '<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
KIMI = (
    "<|tool_calls_section_begin|>\n<|tool_call_begin|>\nfunctions.get_weather:0<|tool_call_argument_begin|>\n"
    '{"city": "Paris", "days": 2}\n<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
    '<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|>\n<|tool_calls_section_end|>'
)
GLM = (
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
    "<arg_value>2</arg_value>\n</tool_call>\n<tool_call>get_time<arg_key>tz</arg_key><arg_value>CET</arg_value>"
    "</tool_call>"
)
MISTRAL_OLD = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}, {"name": "get_time", "arguments": {"tz": "CET"}}]'  # noqa: E501 (one model output line)
MISTRAL_NEW = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 2}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}'
LLAMA_TAG = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}; {"name": "get_time", "parameters": {"tz": "CET"}}'  # noqa: E501 (one model output line)
LLAMA_BARE = '{"name": "get_weather", "parameters": {"city": "Paris", "days": 2}}'
HARMONY = (
    "<|channel|>analysis<|message|>Need the weather and time.<|end|><|start|>assistant<|channel|>commentary "
    'to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris", "days": 2}<|call|><|start|>assistant '
    'to=functions.get_time<|channel|>commentary json<|message|>{"tz": "CET"}<|call|>'
)

CASES = [
    (
        "hermes",
        None,
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>',
        "Checking.",
    ),
    ("qwen3_coder", "qwen3", "Checking.\n\n" + QWEN3_CODER, "Checking."),
    ("deepseek_v3", "deepseek_r1", "Checking." + DS_V3, "Checking."),
    ("deepseek_v3", None, DS_V31, None),
    ("kimi_k2", None, "Checking. " + KIMI, "Checking."),
    ("glm45", "qwen3", "Checking.\n" + GLM, "Checking."),
    ("mistral", None, "Checking." + MISTRAL_OLD, "Checking."),
    ("mistral", None, MISTRAL_NEW, None),
    ("llama3_json", None, LLAMA_TAG, None),
    ("openai", "openai_gptoss", HARMONY, None),
]


@pytest.mark.parametrize(("tool_parser", "reasoning_parser", "text", "content"), CASES)
def test_two_calls_in_every_chunking(tool_parser, reasoning_parser, text, content):
    reasoning = "Need the weather and time." if tool_parser == "openai" else None
    check_all_chunkings(
        text,
        (content, reasoning, [WEATHER, TIME]),
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        tools=TOOLS,
    )


def test_every_vllm_name_is_registered():
    names = {"hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "openai", "glm45", "kimi_k2"}
    assert set(TOOL_PARSERS) == names


def test_llama3_bare_json_call_and_a_json_answer_that_is_not_one():
    check_all_chunkings(LLAMA_BARE, (None, None, [WEATHER]), tool_parser="llama3_json", reasoning_parser=None)
    answer = '{"answer": 42}'
    check_all_chunkings(answer, (answer, None, []), tool_parser="llama3_json", reasoning_parser=None)
    check_all_chunkings("The { brace", ("The { brace", None, []), tool_parser="llama3_json", reasoning_parser=None)


def test_schema_types_the_string_values():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {
                        "n": {"type": "integer"},
                        "x": {"type": "number"},
                        "ok": {"type": "boolean"},
                        "tags": {"type": "array"},
                        "opt": {"type": ["integer", "null"]},
                        "s": {"type": "string"},
                        "o": {"type": "object"},
                    }
                },
            },
        }
    ]
    values = {"n": "7", "x": "2.5", "ok": "True", "tags": '["a", "b"]', "opt": "null", "s": "007", "o": "{'k': 1}"}
    coder = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    glm = "<tool_call>f\n" + "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in values.items())
    expected = {"n": 7, "x": 2.5, "ok": True, "tags": ["a", "b"], "opt": None, "s": "007", "o": {"k": 1}}
    for parser, text in (("qwen3_coder", coder + "</function>\n</tool_call>"), ("glm45", glm + "</tool_call>")):
        message = parse_text(text, tool_parser=parser, reasoning_parser=None, tools=tools)
        assert json.loads(message.tool_calls[0].arguments) == expected, parser


def test_untyped_values_stay_text_for_qwen3_coder_and_json_for_glm45():
    coder = parse_text(
        "<tool_call><function=g><parameter=v>12</parameter></function></tool_call>",
        tool_parser="qwen3_coder",
        reasoning_parser=None,
    )
    glm = parse_text(
        "<tool_call>g<arg_key>v</arg_key><arg_value>12</arg_value></tool_call>",
        tool_parser="glm45",
        reasoning_parser=None,
    )
    assert json.loads(coder.tool_calls[0].arguments) == {"v": "12"}
    assert json.loads(glm.tool_calls[0].arguments) == {"v": 12}


def test_model_given_ids_are_kept():
    kimi = parse_text(KIMI, tool_parser="kimi_k2", reasoning_parser=None)
    assert [c.id for c in kimi.tool_calls] == ["functions.get_weather:0", "functions.get_time:1"]
    mistral = parse_text('[TOOL_CALLS]f[CALL_ID]abc123XYZ[ARGS]{"a": 1}', tool_parser="mistral", reasoning_parser=None)
    assert mistral.tool_calls[0].id == "abc123XYZ"
    generated = parse_text(MISTRAL_NEW, tool_parser="mistral", reasoning_parser=None).tool_calls[0].id
    assert generated.startswith("call_") and generated[5:].isalnum() and len(generated) == 29


@pytest.mark.parametrize(
    ("tool_parser", "text"),
    [
        ("qwen3_coder", "<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>"),
        (
            "deepseek_v3",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{nope<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        (
            "kimi_k2",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_end|><|tool_calls_section_end|>",
        ),
        ("glm45", '<tool_call>{"name": "f"}</tool_call>'),
        ("mistral", "[TOOL_CALLS]get_weather[ARGS]broken"),
        ("llama3_json", '<|python_tag|>{"name": "f", "parameters": '),
    ],
)
def test_unparseable_markup_becomes_content_with_a_warning(tool_parser, text, caplog):
    with caplog.at_level(logging.WARNING):
        check_all_chunkings(
            "Before " + text, ("Before " + text, None, []), tool_parser=tool_parser, reasoning_parser=None
        )
    assert "returned as content" in caplog.text


def test_harmony_final_answer_and_preamble():
    text = (
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>commentary<|message|>Looking."
        "<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
    )
    check_all_chunkings(
        text, ("Looking.It is sunny.", "Think.", []), tool_parser="openai", reasoning_parser="openai_gptoss"
    )


def test_harmony_prompt_ending_inside_analysis_and_plain_text():
    check_all_chunkings(
        "thinking<|end|><|start|>assistant<|channel|>final<|message|>Hi",
        ("Hi", "thinking", []),
        tool_parser=None,
        reasoning_parser="openai_gptoss",
        starts_in_reasoning=True,
    )
    check_all_chunkings("today is fine", ("today is fine", None, []), tool_parser="openai", reasoning_parser=None)
    for short in ("to", "<|", "t"):
        check_all_chunkings(short, (short, None, []), tool_parser="openai", reasoning_parser=None)


def test_harmony_call_without_the_tool_parser_is_content(caplog):
    text = '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>'
    with caplog.at_level(logging.WARNING):
        check_all_chunkings(text, ('{"a": 1}', None, []), tool_parser=None, reasoning_parser="openai_gptoss")
    assert "returned as content" in caplog.text


@pytest.mark.parametrize(
    ("tool_parser", "text", "cut_after"),
    [
        ("deepseek_v3", DS_V31, "<｜tool▁call▁end｜>"),
        ("kimi_k2", KIMI, "<|tool_call_end|>"),
    ],
)
def test_a_call_in_a_section_is_sent_when_it_closes(tool_parser, text, cut_after):
    cut = text.index(cut_after) + len(cut_after)
    first, rest = text[:cut], text[cut:]
    parser = OutputParser(tool_parser=tool_parser, reasoning_parser=None)
    assert calls_in(parser.feed(first)) == [(0, *WEATHER)]
    assert calls_in(parser.feed(rest) + parser.finish()) == [(1, *TIME)]
    assert parser.message().content is None


def calls_in(deltas: list) -> list[tuple]:
    """(index, name, arguments) of each call the deltas open, its fragments joined."""
    calls: dict[int, list] = {}
    for delta in deltas:
        if delta.tool_index is not None:
            call = calls.setdefault(delta.tool_index, [delta.tool_name, ""])
            call[1] += delta.arguments
    return [(index, name, json.loads(arguments)) for index, (name, arguments) in sorted(calls.items())]


def test_harmony_header_cut_off_at_the_end_leaks_nothing():
    text = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>fin"
    check_all_chunkings(text, (None, "Think.", []), tool_parser="openai", reasoning_parser="openai_gptoss")


def test_calls_without_their_section_marker():
    kimi = 'Ok <|tool_call_begin|>functions.get_time:0<|tool_call_argument_begin|>{"tz": "CET"}<|tool_call_end|>'
    check_all_chunkings(kimi, ("Ok", None, [TIME]), tool_parser="kimi_k2", reasoning_parser=None)
    deepseek = '<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "CET"}<｜tool▁call▁end｜>'
    check_all_chunkings(deepseek, (None, None, [TIME]), tool_parser="deepseek_v3", reasoning_parser=None)
