"""Which parsers fit a model: read from the markers its chat template writes."""

from __future__ import annotations

#: (tool parser, markers any of which in the template selects it), most specific first: the
#: XML and GLM formats also write ``<tool_call>``, so they are tried before ``hermes``.
_TOOL_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("openai", ("<|channel|>",)),
    ("deepseek_v3", ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>")),
    ("kimi_k2", ("<|tool_calls_section_begin|>", "<|tool_call_begin|>")),
    ("glm45", ("<arg_key>",)),
    ("qwen3_coder", ("<function=",)),
    ("hermes", ("<tool_call>",)),
    ("mistral", ("[TOOL_CALLS]",)),
    ("llama3_json", ("<|python_tag|>",)),
)

#: Llama 3.2's JSON template has no ``<|python_tag|>``: it asks for ``{"name": ..., "parameters": ...}``.
_LLAMA_HEADER = "<|start_header_id|>"
_LLAMA_JSON_HINTS = ('"parameters"', "Environment: ipython")

#: DeepSeek's role tokens: a template with them and ``<think>`` is DeepSeek-R1's family.
_DEEPSEEK_MARKERS = ("<｜Assistant｜>", "<｜User｜>")


def detect_tool_parser(chat_template: str | None) -> str | None:
    """The tool parser whose markup ``chat_template`` writes, or None."""
    if not chat_template:
        return None
    for name, markers in _TOOL_MARKERS:
        if any(marker in chat_template for marker in markers):
            return name
    if _LLAMA_HEADER in chat_template and any(hint in chat_template for hint in _LLAMA_JSON_HINTS):
        return "llama3_json"
    return None


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning parser whose markup ``chat_template`` writes, or None."""
    if not chat_template:
        return None
    if "<|channel|>" in chat_template:
        return "openai_gptoss"
    if "<think>" in chat_template or "</think>" in chat_template:
        if any(marker in chat_template for marker in _DEEPSEEK_MARKERS):
            return "deepseek_r1"
        return "qwen3"
    return None
