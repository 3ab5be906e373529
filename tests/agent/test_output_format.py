"""[model] tool_parser / reasoning_parser: resolved once at load, "auto" from the chat template."""

from __future__ import annotations

import types

import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.output_format import OutputFormat, resolve_output_format
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.worker.demo import CHAT_TEMPLATE

QWEN3_LIKE = "{{ '<tool_call>' }}{%- if enable_thinking is false %}{{ '<think>\\n\\n</think>' }}{%- endif %}"

QWEN3 = OutputFormat(tool_parser="hermes", reasoning_parser="qwen3")


def model_cfg(**keys):
    return load_config(None, overrides=[f"model.{k}={v}" for k, v in keys.items()], environ={}).model


def tokenizer(template):
    return types.SimpleNamespace(chat_template=template)


@pytest.mark.parametrize(
    ("keys", "template", "expected"),
    [
        ({}, CHAT_TEMPLATE, OutputFormat(tool_parser="hermes", reasoning_parser=None)),  # the demo model
        ({}, QWEN3_LIKE, QWEN3),
        ({}, {"default": "plain", "tool_use": QWEN3_LIKE}, QWEN3),  # named templates: markers in any
        ({}, None, OutputFormat()),
        ({"tool_parser": "none", "reasoning_parser": "none"}, QWEN3_LIKE, OutputFormat()),
        (
            {"tool_parser": "mistral", "reasoning_parser": "deepseek_r1"},
            None,
            OutputFormat(tool_parser="mistral", reasoning_parser="deepseek_r1"),
        ),
    ],
)
def test_resolution(keys, template, expected):
    resolved = resolve_output_format(model_cfg(**keys), tokenizer(template))
    assert resolved == expected
    markers = None if expected.reasoning_parser is None else ("<think>", "</think>")
    assert resolved.reasoning_markers == markers


def test_an_unknown_name_is_a_config_error_listing_the_names():
    with pytest.raises(ConfigError, match="tool_parser.*auto, none, hermes.*kimi_k2.*'hermes2'"):
        model_cfg(tool_parser="hermes2")
    with pytest.raises(ConfigError, match="reasoning_parser.*qwen3.*'think'"):
        model_cfg(reasoning_parser="think")


async def test_the_engine_holds_the_resolved_names():
    cfg = load_config(None, overrides=["model.tool_parser=llama3_json"], environ={})
    with trio.fail_after(10):
        async with open_fake_engine(cfg) as fake:
            assert fake.engine.output_format == OutputFormat(tool_parser="llama3_json", reasoning_parser=None)
