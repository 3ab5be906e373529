"""Which output parsers a loaded model's chat replies go through (``[model] tool_parser`` and
``[model] reasoning_parser``), resolved once when the model is loaded.

"auto" picks a parser from the chat template's text (``parsers.detect_*``), "none" turns it
off, any other value is a parser's name (checked when the configuration is loaded).
"""

from __future__ import annotations

import logging
from typing import Any

import attrs

from . import parsers
from .config.sections import PARSER_AUTO, PARSER_NONE, ModelConfig
from .prompting.tool_prompt import TOOL_PROMPT_PARSER, template_takes_tools

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class OutputFormat:
    """The resolved parser names (None: off) for the model being served."""

    tool_parser: str | None = None
    reasoning_parser: str | None = None

    @property
    def markup(self) -> frozenset[str]:
        """The markup strings the resolved parsers read (kept in the reply's text)."""
        return parsers.markup_strings(self.tool_parser, self.reasoning_parser)

    @property
    def reasoning_markers(self) -> tuple[str, str] | None:
        """(start, end) of the model's thinking block, when it has a reasoning parser."""
        if self.reasoning_parser is None:
            return None
        return parsers.reasoning_markers(self.reasoning_parser)


def resolve_output_format(model_cfg: ModelConfig, tokenizer: Any) -> OutputFormat:
    """The configured parsers, "auto" detected from ``tokenizer``'s chat template."""
    template = chat_template_text(tokenizer)
    resolved = OutputFormat(
        tool_parser=_resolve(model_cfg.tool_parser, _detect_tool_parser, template),
        reasoning_parser=_resolve(model_cfg.reasoning_parser, parsers.detect_reasoning_parser, template),
    )
    logger.info(
        "output parsers: tool_parser=%s (configured %s), reasoning_parser=%s (configured %s)",
        resolved.tool_parser,
        model_cfg.tool_parser,
        resolved.reasoning_parser,
        model_cfg.reasoning_parser,
    )
    return resolved


def _detect_tool_parser(template: str | None) -> str | None:
    """The parser of the template's own markup; for a template that cannot render tools at all,
    the parser of the format admission writes the tools in (prompting/tool_prompt.py)."""
    if template is not None and not template_takes_tools(template):
        return TOOL_PROMPT_PARSER
    return parsers.detect_tool_parser(template)


def _resolve(setting: str, detect: Any, template: str | None) -> str | None:
    if setting == PARSER_NONE:
        return None
    if setting == PARSER_AUTO:
        return detect(template)
    return setting


def chat_template_text(tokenizer: Any) -> str | None:
    """The tokenizer's chat template as text (a Hugging Face tokenizer may hold several named
    ones, e.g. "default" and "tool_use": they are joined, so markers in any count)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    if isinstance(template, list):  # the serialized form: [{"name": ..., "template": ...}]
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None
