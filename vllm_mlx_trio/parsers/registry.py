"""The parsers by their vLLM names (``--tool-call-parser`` / ``--reasoning-parser``)."""

from __future__ import annotations

from .json_formats import HermesFormat, Llama3JsonFormat, MistralFormat
from .reasoning import REASONING_PARSERS
from .tag_formats import DeepSeekV3Format, Glm45Format, KimiK2Format, Qwen3CoderFormat
from .tool_stream import ToolFormat

#: gpt-oss harmony: one parser reads both channels and calls (see harmony.py).
HARMONY_TOOLS = "openai"
HARMONY_REASONING = "openai_gptoss"

_FORMATS: tuple[type[ToolFormat], ...] = (
    HermesFormat,
    Qwen3CoderFormat,
    Llama3JsonFormat,
    MistralFormat,
    DeepSeekV3Format,
    Glm45Format,
    KimiK2Format,
)


class HarmonyTools:
    """gpt-oss harmony calls; read together with the channels by :class:`.harmony.HarmonyStream`."""

    name = HARMONY_TOOLS


TOOL_PARSERS: dict[str, type] = {cls.name: cls for cls in (*_FORMATS, HarmonyTools)}


def markup_strings(tool_parser: str | None, reasoning_parser: str | None) -> frozenset[str]:
    """The markup the parsers read; the text fed to them must keep it, though many are special tokens."""
    from .harmony import MARKUP as HARMONY_MARKUP

    strings: set[str] = set()
    if HARMONY_TOOLS in (tool_parser, reasoning_parser) or reasoning_parser == HARMONY_REASONING:
        strings.update(HARMONY_MARKUP)
    if tool_parser and tool_parser != HARMONY_TOOLS:
        strings.update(TOOL_PARSERS[tool_parser].markup)
    if reasoning_parser and reasoning_parser != HARMONY_REASONING:
        strings.update((REASONING_PARSERS[reasoning_parser].start, REASONING_PARSERS[reasoning_parser].end))
    return frozenset(strings)


__all__ = ["HARMONY_REASONING", "HARMONY_TOOLS", "REASONING_PARSERS", "TOOL_PARSERS", "markup_strings"]
