"""OpenAI request bodies as declared msgspec Structs: one class per JSON object shape.

The shapes are checked by ``msgspec.convert`` (strict: no unknown field, no ``1`` for ``true``,
no ``"3"`` for ``3``); :mod:`.requests` turns a decoded body into a ``ParsedRequest`` and maps a
``msgspec.ValidationError`` to our :class:`~vllm_mlx_trio.errors.InvalidRequestError`, worded
as the server always worded it. Bounds that depend on the model or the config (context,
vocabulary, ``limits.*``) are checked later, by admission.

Shapes this server does not honour yet (best_of, echo, suffix, audio parts...)
are declared too, so the next features only have to act on them: :data:`NOT_YET_OFF` lists the
values at which such a field is accepted today (its "off" values).

msgspec over attrs + cattrs: a typical 4-turn chat body decodes in ~1.5 µs against ~19 µs
(median of 7 x 20,000 decodes; cattrs with strict scalar hooks and ``forbid_extra_keys``), and
it keeps Python's unbounded ints as sent (a 300-digit ``max_tokens`` is refused by range, its value
quoted in the message).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

#: Longest participant ``name`` accepted (OpenAI's schema has no bound; templates paste it).
MAX_NAME_CHARS = 256
ROLES = ("system", "developer", "user", "assistant", "tool")


class _Object(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A JSON object with exactly the declared fields (an unknown one is an error)."""


class _Part(msgspec.Struct, tag_field="type", frozen=True):
    """A message content part, told apart by its ``type``. Other keys of a part are ignored,
    as this server always did (clients add their own, e.g. ``cache_control``)."""


# -- message content parts ---------------------------------------------------------------


class TextPartIn(_Part, tag="text"):
    text: str


class ImageUrl(_Object):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePartIn(_Part, tag="image_url"):
    image_url: ImageUrl


class VideoUrl(_Object):
    url: str


class VideoPartIn(_Part, tag="video_url"):
    video_url: VideoUrl


class VideoPartAlt(_Part, tag="video"):
    """The ``{"type": "video", "video": "<url>"}`` part some clients (Qwen-VL's examples) send:
    the same as a ``video_url`` part."""

    video: str


class InputAudio(_Object):
    data: str
    format: str


class AudioPartIn(_Part, tag="input_audio"):
    """Declared for the shape; refused for now (no audio runner)."""

    input_audio: InputAudio


ContentPartIn = TextPartIn | ImagePartIn | VideoPartIn | VideoPartAlt | AudioPartIn


# -- tools (chat only: http/openai/requests.py, _tool_use) ----------------------------------------------


class FunctionDef(_Object):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Object):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(_Object):
    name: str


class NamedToolChoice(_Object):
    type: Literal["function"]
    function: FunctionName


class FunctionCall(_Object):
    name: str
    arguments: str


class ToolCall(_Object):
    id: str
    type: Literal["function"]
    function: FunctionCall


# -- response_format and vLLM's guided decoding (structured output) -------------------------


class _Format(_Object, tag_field="type"):
    pass


class TextFormat(_Format, tag="text"):
    pass


class JsonObjectFormat(_Format, tag="json_object"):
    pass


class JsonSchemaSpec(_Object):
    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class JsonSchemaFormat(_Format, tag="json_schema"):
    json_schema: JsonSchemaSpec


ResponseFormat = TextFormat | JsonObjectFormat | JsonSchemaFormat


class StructuredOutputs(_Object):
    """vLLM's ``structured_outputs``: at most one of these may be set."""

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None


#: The body fields that each set an output constraint (at most one per request).
CONSTRAINT_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


#: The chat body fields of tool calling and the template's extra variables (http/openai/tool_requests.py).
CHAT_AGENT_FIELDS = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs", "reasoning_effort")


#: The chat body fields of media input (video frame sampling; vllm_mlx_trio/media).
CHAT_MEDIA_FIELDS = ("video_fps", "video_max_frames")


# -- messages ------------------------------------------------------------------------------


#: A participant's name (templates paste it as given).
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]


class MessageIn(_Object):
    """One chat turn. ``role`` is checked against :data:`ROLES` by the converter (its message
    names the value given). ``content`` may be null only on an assistant turn that made
    ``tool_calls`` or carries its reasoning; a ``tool`` turn names the call it answers
    (``tool_call_id``). An assistant turn sent back as a server reply was may keep its
    ``reasoning_content`` (or the ``reasoning`` alias): templates that show past thinking read
    it. The audio and legacy ``function_call`` fields are accepted only when off."""

    role: str
    content: str | list[ContentPartIn] | None = None
    name: Name | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None
    audio: dict[str, Any] | None = None
    annotations: list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class StreamOptions(_Object):
    #: UNSET when absent: ``{}`` is no option at all, ``{"include_usage": null}`` is one.
    include_usage: bool | None | msgspec.UnsetType = msgspec.UNSET


# -- bodies --------------------------------------------------------------------------------


class _Body(_Object):
    """The fields both routes share: sampling, streaming, and the not-yet ones."""

    model: str | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float | None] | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    cache_salt: str | None = None
    stream_interval: int | None = None
    # structured output (http/openai/requests.py, _constraint)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # tool calling (chat; refused on completions: COMPLETION_OFF)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # not honoured yet: accepted only at an off value (NOT_YET_OFF)
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class ChatBody(_Body):
    messages: list[MessageIn] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    # media (vllm_mlx_trio/media): frame sampling of the video parts; none: the [mllm] defaults
    video_fps: float | None = None
    video_max_frames: int | None = None


class CompletionBody(_Body):
    prompt: str | list[str] | None = None
    logprobs: int | None = None


#: Fields a later version honours, and the values at which they are accepted today. A value
#: is off when it equals one of these *and* has its JSON type (``1`` is not ``true``).
NOT_YET_OFF: dict[str, tuple] = {
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None,),
}
#: Legacy completions take no tools (a raw prompt has no template to render them): accepted
#: only at these off values there, as before chat honoured them.
COMPLETION_OFF: dict[str, tuple] = {
    **NOT_YET_OFF,
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
}
#: Message fields this server cannot act on (audio, refusals, legacy function calls): accepted only when
#: off, as openai-python writes them when an answer is sent back as the next turn's input.
MESSAGE_OFF = {
    "refusal": (None, ""),
    "function_call": (None,),
    "audio": (None,),
    "annotations": (None, []),
}


def field_names(schema: type[msgspec.Struct]) -> frozenset[str]:
    """The JSON field names a Struct declares."""
    return frozenset(schema.__struct_fields__)


def field_kind(schema: type[msgspec.Struct], name: str) -> type | None:
    """The scalar type a field declares (``int`` for ``int | None``), or None for the others."""
    for field in msgspec.structs.fields(schema):
        if field.name == name:
            kinds = [k for k in getattr(field.type, "__args__", (field.type,)) if k is not type(None)]
            return kinds[0] if len(kinds) == 1 and kinds[0] in (str, int, float, bool) else None
    return None
