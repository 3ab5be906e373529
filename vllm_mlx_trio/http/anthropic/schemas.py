"""Anthropic Messages request bodies as strict msgspec Structs (an unknown field is a 400).

Bookkeeping fields that do not change the answer are declared and ignored: ``metadata``,
``service_tier``, ``inference_geo``, ``speed``, ``user_profile_id``, ``workspace_id`` and
``cache_control`` at the top or on any block or tool (this server's prefix cache is automatic).
Fields that would change the answer but are not supported are refused by name before
decoding (:data:`UNSUPPORTED_FIELDS`, :data:`UNSUPPORTED_BLOCKS`, server tools).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

#: Top-level fields Anthropic's API has that this server cannot honour: a 400 naming them.
UNSUPPORTED_FIELDS = {
    "mcp_servers": "MCP servers",
    "container": "code-execution containers",
    "diagnostics": "prompt-cache diagnostics",
}
#: Content block types (server tools' results, documents with citations...) refused by name.
UNSUPPORTED_BLOCKS = frozenset(
    {
        "document",
        "search_result",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
        "container_upload",
        "tool_search_tool_result",
    }
)
#: A client tool's ``type``; any other (``web_search_20250305``, ``bash_20250124``...) is a server tool.
CLIENT_TOOL_TYPE = "custom"


class _Object(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A JSON object with exactly the declared fields."""


class _Block(_Object, tag_field="type"):
    """A content block, told apart by its ``type``."""


CacheControl = dict[str, Any] | None


class TextBlock(_Block, tag="text"):
    text: str
    cache_control: CacheControl = None
    #: Only "no citations" is accepted (checked before decoding).
    citations: list[Any] | None = None


class Base64Source(_Object, tag_field="type", tag="base64"):
    media_type: str
    data: str


class UrlSource(_Object, tag_field="type", tag="url"):
    url: str


class ImageBlock(_Block, tag="image"):
    source: Base64Source | UrlSource
    cache_control: CacheControl = None


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str | None = None
    cache_control: CacheControl = None


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str
    cache_control: CacheControl = None


Block = TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class MessageParam(_Object):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(_Object):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None
    strict: bool | None = None


class _Choice(_Object, tag_field="type"):
    pass


class AutoChoice(_Choice, tag="auto"):
    disable_parallel_tool_use: bool | None = None


class AnyChoice(_Choice, tag="any"):
    disable_parallel_tool_use: bool | None = None


class NamedChoice(_Choice, tag="tool"):
    name: str
    disable_parallel_tool_use: bool | None = None


class NoneChoice(_Choice, tag="none"):
    pass


ToolChoice = AutoChoice | AnyChoice | NamedChoice | NoneChoice


class _Thinking(_Object, tag_field="type"):
    pass


#: ``thinking.display``: the reply's thinking text shown (``summarized``, the default) or left
#: out (``omitted``: thinking blocks with empty text).
Display = Literal["summarized", "omitted"] | None


class ThinkingEnabled(_Thinking, tag="enabled"):
    budget_tokens: int
    display: Display = None


class ThinkingAdaptive(_Thinking, tag="adaptive"):
    """The model decides whether and how long to think: the template's thinking on, no budget."""

    display: Display = None


class ThinkingDisabled(_Thinking, tag="disabled"):
    pass


Thinking = ThinkingEnabled | ThinkingAdaptive | ThinkingDisabled

#: The ``context_management.edits`` types this server applies.
CLEAR_THINKING = "clear_thinking_20251015"


class ThinkingTurns(_Object, tag_field="type", tag="thinking_turns"):
    value: int


class AllThinkingTurns(_Object, tag_field="type", tag="all"):
    pass


class ClearThinkingEdit(_Object, tag_field="type", tag=CLEAR_THINKING):
    """Earlier assistant turns' thinking: kept for all of them (``"all"`` or ``{"type": "all"}``)
    or the last ``value`` turns that have some (without ``keep``: the last one, Anthropic's
    default); cleared (left out of the prompt) for the rest."""

    keep: Literal["all"] | ThinkingTurns | AllThinkingTurns | None = None


class ContextManagement(_Object):
    edits: list[ClearThinkingEdit] | None = None


class JsonOutputFormat(_Object, tag_field="type", tag="json_schema"):
    schema: dict[str, Any]


class OutputConfig(_Object):
    """``output_config``: ``format`` constrains the reply to a JSON schema (the grammar);
    ``effort`` reaches the template as ``reasoning_effort`` (``xhigh``/``max`` have no
    template level: a 400)."""

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: JsonOutputFormat | None = None


class Metadata(_Object):
    user_id: str | None = None


class CountTokensBody(_Object):
    """``POST /v1/messages/count_tokens``: what shapes the prompt, nothing about sampling."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: CacheControl = None


class MessagesBody(_Object):
    """``POST /v1/messages``."""

    model: str
    messages: list[MessageParam]
    max_tokens: int
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    #: Bookkeeping: where and how fast Anthropic would serve it, whom to bill.
    cache_control: CacheControl = None
    inference_geo: str | None = None
    speed: Literal["standard", "fast"] | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
