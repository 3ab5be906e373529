"""Choosing parsers from a chat template, and the ``parse-output`` command."""

from __future__ import annotations

import json

import pytest

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.parsers import detect_reasoning_parser, detect_tool_parser
from vllm_mlx_trio.worker.demo import CHAT_TEMPLATE as DEMO_TEMPLATE

# The lines of each family's chat template that carry its markup (shortened from the models' templates).
QWEN3 = (
    "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... within <tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>{%- endif %}'
    "{%- if '</think>' in content %}{%- set reasoning_content = content.split('</think>')[0] %}{%- endif %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}"
)
QWEN25 = '<|im_start|>system ... <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
QWEN3_CODER = (
    "If you choose to call a function ONLY reply in the following format:\n<tool_call>\n<function=example>\n"
    "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>"
)
LLAMA31 = (
    "<|start_header_id|>ipython<|end_header_id|> {{- '<|python_tag|>' + tool_call.name + '.call(' }}"
    ' Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
)
LLAMA32 = (
    '{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}{{- "Environment: ipython\\n" }}'
    ' Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.'
)
MISTRAL = '{{- "[AVAILABLE_TOOLS] [" }} ... {{- "[TOOL_CALLS] [" }} ... [TOOL_RESULTS]'
DEEPSEEK_V3 = (
    "{{'<｜User｜>' + message['content'] + '<｜Assistant｜>'}} {{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + "
    "tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n```json\\n'}}"
)
DEEPSEEK_R1 = DEEPSEEK_V3 + "{%- if '</think>' in content %}{% endif %}{{'<｜Assistant｜><think>\\n'}}"
GPT_OSS = (
    "{{- '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}"
    "{{- '<|start|>assistant to=functions.' + tool_call.name + '<|channel|>commentary json<|message|>' }}"
)
GLM45 = (
    "<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n</tool_call>"
    "{{- '<|assistant|>\\n<think>' + reasoning_content.strip() + '</think>' }}"
)
KIMI_K2 = (
    "<|im_system|>tool_declare<|im_middle|>{{ tools | tojson }}<|im_end|>"
    "<|tool_calls_section_begin|>{%- for tc in message.tool_calls %}<|tool_call_begin|>{{ tc.id }}"
    "<|tool_call_argument_begin|>{{ tc.function.arguments }}<|tool_call_end|>{%- endfor %}<|tool_calls_section_end|>"
)


@pytest.mark.parametrize(
    ("template", "tool", "reasoning"),
    [
        (QWEN3, "hermes", "qwen3"),
        (QWEN25, "hermes", None),
        (QWEN3_CODER, "qwen3_coder", None),
        (LLAMA31, "llama3_json", None),
        (LLAMA32, "llama3_json", None),
        (MISTRAL, "mistral", None),
        (DEEPSEEK_V3, "deepseek_v3", None),
        (DEEPSEEK_R1, "deepseek_v3", "deepseek_r1"),
        (GPT_OSS, "openai", "openai_gptoss"),
        (GLM45, "glm45", "qwen3"),
        (KIMI_K2, "kimi_k2", None),
        (DEMO_TEMPLATE, "hermes", None),  # the demo model calls tools Qwen-style
        (None, None, None),
    ],
)
def test_detect_from_template(template, tool, reasoning):
    assert detect_tool_parser(template) == tool
    assert detect_reasoning_parser(template) == reasoning


RAW = '<think>\nhmm\n</think>\n\nOK <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def _run(capsys, monkeypatch, stdin: str, *argv: str) -> tuple[int, str, str]:
    import io

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(["parse-output", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("chunk", ["0", "1", "3"])
def test_parse_output_prints_the_openai_message(capsys, monkeypatch, chunk):
    code, out, _ = _run(
        capsys, monkeypatch, RAW, "--tool-parser", "hermes", "--reasoning-parser", "qwen3", "--chunk-size", chunk
    )
    message = json.loads(out)
    assert code == 0
    assert message["content"] == "OK" and message["reasoning_content"] == "hmm"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}


def test_parse_output_auto_from_a_tokenizer_config_and_typed_by_tools(capsys, monkeypatch, tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_CODER}))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}}]
    (tmp_path / "tools.json").write_text(json.dumps({"tools": tools}))
    raw = "<tool_call>\n<function=f>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>"
    code, out, _ = _run(
        capsys,
        monkeypatch,
        raw,
        "--tool-parser",
        "auto",
        "--chat-template",
        str(tmp_path / "tokenizer_config.json"),
        "--tools",
        str(tmp_path / "tools.json"),
    )
    assert code == 0 and json.loads(json.loads(out)["tool_calls"][0]["function"]["arguments"]) == {"n": 5}


def test_parse_output_reads_a_bare_closer_as_reasoning_and_prints_deltas(capsys, monkeypatch):
    code, out, _ = _run(
        capsys, monkeypatch, "plan\n</think>\n\nDone.", "--reasoning-parser", "qwen3", "--deltas", "--chunk-size", "2"
    )
    lines = out.splitlines()
    deltas = [json.loads(line) for line in lines if line.startswith("{") and line.endswith("}")]
    message = json.loads("\n".join(lines[len(deltas) :]))
    assert code == 0 and (message["content"], message["reasoning_content"]) == ("Done.", "plan")
    assert "".join(d.get("reasoning", "") for d in deltas) == "plan"


def test_parse_output_list_and_errors(capsys, monkeypatch):
    code, out, _ = _run(capsys, monkeypatch, "", "--list")
    names = json.loads(out)
    assert code == 0 and "kimi_k2" in names["tool_parsers"] and "openai_gptoss" in names["reasoning_parsers"]
    code, _, err = _run(capsys, monkeypatch, "x", "--tool-parser", "auto")
    assert code == 2 and "--chat-template" in err
    with pytest.raises(SystemExit):
        _run(capsys, monkeypatch, "x", "--tool-parser", "nope")


def test_markup_strings_name_what_the_detokenizer_must_keep():
    from vllm_mlx_trio.parsers import markup_strings

    assert markup_strings("hermes", "qwen3") == {"<tool_call>", "</tool_call>", "<think>", "</think>"}
    assert {"<|channel|>", "<|message|>", "<|call|>"} <= markup_strings("openai", None)
    assert markup_strings(None, "openai_gptoss") == markup_strings("openai", "openai_gptoss")
    assert "<|tool_call_argument_begin|>" in markup_strings("kimi_k2", None)
    assert "<｜tool▁sep｜>" in markup_strings("deepseek_v3", None)
    assert markup_strings(None, None) == frozenset()
