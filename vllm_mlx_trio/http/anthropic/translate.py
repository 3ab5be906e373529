"""An Anthropic Messages body -> the engine's chat turns and :class:`SamplingParams`.

Strict like the chat route: an unknown field is a 400 naming it (worded as Anthropic words
it, ``messages.0.content.1.foo: Extra inputs are not permitted``), a field that would change
the answer but is not supported is a 400 naming it, and a bookkeeping field is accepted and
ignored. The model must be the served one (a 404 otherwise, as on the chat route).
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import msgspec

from ...core.params import SamplingParams
from ...errors import InvalidRequestError, ModelNotFoundError
from ...messages import ChatMessage, ContentPart, ImagePart, TextPart
from ..requests import _content_hash
from . import schemas

#: System blocks are joined with a blank line into the one system turn templates take.
SYSTEM_BLOCK_SEPARATOR = "\n\n"
_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>.*)`)?$", re.DOTALL)
_FIELD = re.compile(r"Object (?P<what>contains unknown|missing required) field `(?P<name>[^`]*)`")


@attrs.frozen(kw_only=True)
class MessagesRequest:
    """What the Messages route needs from a body, checked."""

    prompt: tuple[ChatMessage, ...]
    params: SamplingParams
    stream: bool


def parse_messages(body: Any, *, model_name: str) -> MessagesRequest:
    decoded = _decode(body, schemas.MessagesBody, model_name)
    prompt = build_prompt(decoded)
    params = SamplingParams(
        max_tokens=decoded.max_tokens,
        stop=tuple(decoded.stop_sequences or ()),
        **_sampling_fields(decoded),
    )
    return MessagesRequest(prompt=prompt, params=params, stream=bool(decoded.stream))


def parse_count_tokens(body: Any, *, model_name: str) -> tuple[ChatMessage, ...]:
    return build_prompt(_decode(body, schemas.CountTokensBody, model_name))


def _sampling_fields(body: schemas.MessagesBody) -> dict[str, Any]:
    fields = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    return {name: value for name, value in fields.items() if value is not None}


def _decode(body: Any, schema: type, model_name: str) -> Any:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    check_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequestError("model: Field required (a string).", param="model")
    if model != model_name:
        raise ModelNotFoundError(model)
    try:
        return msgspec.convert(body, schema)
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:
        raise validation_error(str(exc)) from None


def validation_error(text: str) -> InvalidRequestError:
    """msgspec's complaint as Anthropic words it: ``a.0.b: what is wrong``."""
    match = _AT.match(text)
    assert match is not None  # the pattern matches any text
    path = _dotted(match["path"] or "")
    what = match["text"]
    field = _FIELD.match(what)
    if field is not None:
        path = f"{path}.{field['name']}" if path else field["name"]
        what = "Extra inputs are not permitted" if field["what"] == "contains unknown" else "Field required"
    return InvalidRequestError(f"{path}: {what}" if path else what, param=path or None)


def _dotted(path: str) -> str:
    """msgspec's ``.messages[0].content`` as Anthropic's ``messages.0.content``."""
    return re.sub(r"\[(\d+)\]", r".\1", path).lstrip(".")


# -- refusing what is not supported, by name -------------------------------------------------


def check_unsupported(body: dict) -> None:
    for name, what in schemas.UNSUPPORTED_FIELDS.items():
        if body.get(name) is not None:
            raise InvalidRequestError(f"{name}: {what} are not supported by this server.", param=name)
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind is not None and kind != schemas.CLIENT_TOOL_TYPE:
            raise InvalidRequestError(
                f"tools.{i}.type: server tools ({kind!r:.60}) are not supported by this server; "
                "only client tools with an input_schema.",
                param=f"tools.{i}.type",
            )
    _check_blocks(body.get("system"), "system")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict):
            _check_blocks(message.get("content"), f"messages.{i}.content")


def _check_blocks(blocks: Any, where: str) -> None:
    for j, block in enumerate(blocks if isinstance(blocks, list) else ()):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if isinstance(kind, str) and kind in schemas.UNSUPPORTED_BLOCKS:
            raise InvalidRequestError(
                f"{where}.{j}: content blocks of type {kind!r} are not supported by this server.",
                param=f"{where}.{j}.type",
            )
        if block.get("citations"):
            raise InvalidRequestError(
                f"{where}.{j}.citations: citations are not supported by this server.", param=f"{where}.{j}.citations"
            )
        if kind == "tool_result":
            _check_blocks(block.get("content"), f"{where}.{j}.content")


# -- the prompt ------------------------------------------------------------------------------


def build_prompt(body: schemas.MessagesBody | schemas.CountTokensBody) -> tuple[ChatMessage, ...]:
    _check_not_yet(body)
    if not body.messages:
        raise InvalidRequestError("messages: at least one message is required.", param="messages")
    if body.messages[-1].role == "assistant":
        raise InvalidRequestError(
            "messages: a final assistant turn (a prefill to continue) is not supported by this server yet.",
            param="messages",
        )
    turns = [_message(message, i) for i, message in enumerate(body.messages)]
    system = _system_text(body.system)
    if system is not None:
        turns.insert(0, ChatMessage(role="system", content=system))
    return tuple(turns)


def _check_not_yet(body: schemas.MessagesBody | schemas.CountTokensBody) -> None:
    """Tools and thinking arrive with the tool and reasoning parsers; until then a 400."""
    if body.tools:
        raise InvalidRequestError("tools: tool use is not supported by this server yet.", param="tools")
    if body.tool_choice is not None and not isinstance(body.tool_choice, schemas.NoneChoice | schemas.AutoChoice):
        raise InvalidRequestError("tool_choice: tool use is not supported by this server yet.", param="tool_choice")
    if isinstance(body.thinking, schemas.ThinkingEnabled):
        raise InvalidRequestError("thinking: extended thinking is not supported by this server yet.", param="thinking")


def _system_text(system: str | list[schemas.TextBlock] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system or None
    text = SYSTEM_BLOCK_SEPARATOR.join(block.text for block in system)
    return text or None


def _message(message: schemas.MessageParam, index: int) -> ChatMessage:
    content = message.content
    if isinstance(content, str):
        return ChatMessage(role=message.role, content=content)
    parts: list[ContentPart] = []
    for j, block in enumerate(content):
        part = _part(block, f"messages.{index}.content.{j}")
        if part is not None:
            parts.append(part)
    return ChatMessage(role=message.role, content=tuple(parts))


def _part(block: schemas.Block, where: str) -> ContentPart | None:
    """A block as an engine content part; None for what templates never see (thinking)."""
    if isinstance(block, schemas.TextBlock):
        return TextPart(text=block.text)
    if isinstance(block, schemas.ImageBlock):
        return image_part(block)
    if isinstance(block, schemas.ThinkingBlock | schemas.RedactedThinkingBlock):
        return None  # earlier turns' reasoning: accepted, and dropped as chat templates do
    kind = "tool_use" if isinstance(block, schemas.ToolUseBlock) else "tool_result"
    raise InvalidRequestError(f"{where}: {kind} blocks are not supported by this server yet.", param=where)


def image_part(block: schemas.ImageBlock) -> ImagePart:
    """An image by reference: a data URL of base64 bytes, or the URL as given."""
    source = block.source
    if isinstance(source, schemas.Base64Source):
        ref = f"data:{source.media_type};base64,{source.data}"
    else:
        ref = source.url
    return ImagePart(ref=ref, content_hash=_content_hash(ref))
