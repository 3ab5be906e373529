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

__all__ = ["HARMONY_REASONING", "HARMONY_TOOLS", "REASONING_PARSERS", "TOOL_PARSERS"]
