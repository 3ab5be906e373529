"""Output parsers: tool calls and reasoning read out of the model's text, whole or as it streams.

Pure (no trio, no mlx, no quart). One :class:`OutputParser` per choice; names follow vLLM's
``--tool-call-parser`` and ``--reasoning-parser`` so users carry their flags over.
"""

from .detect import detect_reasoning_parser, detect_tool_parser
from .output import OutputParser, parse_text
from .reasoning import prompt_ends_in_reasoning, reasoning_markers
from .registry import REASONING_PARSERS, TOOL_PARSERS, markup_strings
from .types import ParsedDelta, ParsedMessage, ToolCall

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "OutputParser",
    "ParsedDelta",
    "ParsedMessage",
    "ToolCall",
    "detect_reasoning_parser",
    "detect_tool_parser",
    "markup_strings",
    "parse_text",
    "prompt_ends_in_reasoning",
    "reasoning_markers",
]
