"""OpenAI Responses request bodies as strict msgspec Structs (an unknown field is a 400).

``input`` items are decoded one by one (:func:`..translate.input_items`): a message item may
leave out its ``type``, which a tagged union cannot express. Bookkeeping fields (``metadata``
is echoed back; ``user``, ``safety_identifier``, ``prompt_cache_key``, ``service_tier``,
``stream_options``) are accepted and change nothing in the answer.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

#: What ``include`` may ask for: encrypted reasoning (there is none to include here).
ACCEPTED_INCLUDES = frozenset({"reasoning.encrypted_content"})


class _Object(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A JSON object with exactly the declared fields."""


class _Content(_Object, tag_field="type"):
    pass


class InputText(_Content, tag="input_text"):
    text: str


class OutputText(_Content, tag="output_text"):
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class Refusal(_Content, tag="refusal"):
    refusal: str


class InputImage(_Content, tag="input_image"):
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


Content = InputText | OutputText | Refusal | InputImage


class MessageItem(_Object):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Content]
    type: Literal["message"] | None = None
    id: str | None = None
    status: str | None = None


class FunctionCallItem(_Object):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    #: The tool's namespace (an MCP server's, as Codex sends it back).
    namespace: str | None = None


class CustomToolCallItem(_Object):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = None


class CustomToolCallOutputItem(_Object):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[Content]
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Object):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Content]
    id: str | None = None
    status: str | None = None


class ReasoningItem(_Object):
    type: Literal["reasoning"]
    summary: list[dict[str, Any]]
    id: str | None = None
    content: list[dict[str, Any]] | None = None
    encrypted_content: str | None = None
    status: str | None = None


class _Format(_Object, tag_field="type"):
    pass


class TextOutputFormat(_Format, tag="text"):
    pass


class JsonSchemaOutputFormat(_Format, tag="json_schema"):
    name: str
    schema: dict[str, Any]
    description: str | None = None
    strict: bool | None = None


class JsonObjectOutputFormat(_Format, tag="json_object"):
    pass


class TextConfig(_Object):
    format: TextOutputFormat | JsonSchemaOutputFormat | JsonObjectOutputFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Object):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class StreamOptions(_Object):
    include_obfuscation: bool | None = None


class ResponsesBody(_Object):
    """``POST /v1/responses``."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    background: bool | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None
