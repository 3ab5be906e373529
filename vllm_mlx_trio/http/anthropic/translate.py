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
from ...errors import InvalidRequestError
from ...messages import CalledTool, ChatMessage, ChatPrompt, ContentPart, ImagePart, TextPart
from ...output_format import OutputFormat
from ..agent_output import OutputSpec
from ..model_names import ServedNames
from ..openai.requests import _content_hash
from . import schemas
from .tools import MarkerIds, tool_arguments, tool_plan, tool_result_content

#: System blocks are joined with a blank line into the one system turn templates take.
SYSTEM_BLOCK_SEPARATOR = "\n\n"
_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>.*)`)?$", re.DOTALL)
_FIELD = re.compile(r"Object (?P<what>contains unknown|missing required) field `(?P<name>[^`]*)`")


@attrs.frozen(kw_only=True)
class MessagesRequest:
    """What the Messages route needs from a body, checked."""

    prompt: ChatPrompt
    params: SamplingParams
    stream: bool
    #: How the reply is parsed into thinking, text and tool_use blocks (None: one text block).
    output: OutputSpec | None = None
    #: ``thinking.display = "omitted"``: the reply's thinking blocks carry no text.
    omit_thinking: bool = False


def parse_messages(
    body: Any, *, model_names: ServedNames, output: OutputFormat, markers: MarkerIds | None = None
) -> MessagesRequest:
    """``markers``: the thinking block's markers as token ids (``budget_tokens`` is enforced with them)."""
    decoded = _decode(body, schemas.MessagesBody, model_names)
    plan = tool_plan(decoded, output, markers)
    prompt = ChatPrompt(messages=build_turns(decoded), tools=plan.tools, template_kwargs=plan.template_kwargs)
    params = SamplingParams(
        max_tokens=decoded.max_tokens,
        stop=tuple(decoded.stop_sequences or ()),
        constraint=plan.constraint,
        thinking_budget=plan.thinking_budget,
        adapter=model_names.adapter(decoded.model),
        **_sampling_fields(decoded),
        **prefill_options(decoded),
    )
    omit = getattr(decoded.thinking, "display", None) == "omitted"
    return MessagesRequest(
        prompt=prompt, params=params, stream=bool(decoded.stream), output=plan.output, omit_thinking=omit
    )


def parse_count_tokens(body: Any, *, model_names: ServedNames, output: OutputFormat) -> tuple[ChatPrompt, bool]:
    """The prompt to count, and whether it ends in a prefill (rendered left open)."""
    decoded = _decode(body, schemas.CountTokensBody, model_names)
    plan = tool_plan(decoded, output)
    prompt = ChatPrompt(messages=build_turns(decoded), tools=plan.tools, template_kwargs=plan.template_kwargs)
    return prompt, ends_in_prefill(decoded)


def ends_in_prefill(body: schemas.MessagesBody | schemas.CountTokensBody) -> bool:
    """A final assistant turn is a prefill: the reply continues its text."""
    return bool(body.messages) and body.messages[-1].role == "assistant"


def prefill_options(body: schemas.MessagesBody | schemas.CountTokensBody) -> dict[str, bool]:
    """The template options of a prompt ending in a prefill: the last turn left open
    (vLLM's ``continue_final_message``), no assistant opening after it."""
    if not ends_in_prefill(body):
        return {}
    return {"add_generation_prompt": False, "continue_final_message": True}


def _sampling_fields(body: schemas.MessagesBody) -> dict[str, Any]:
    fields = {"temperature": body.temperature, "top_p": body.top_p, "top_k": body.top_k}
    return {name: value for name, value in fields.items() if value is not None}


def _decode(body: Any, schema: type, model_names: ServedNames) -> Any:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    check_unsupported(body)
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequestError("model: Field required (a string).", param="model")
    model_names.resolve(model)
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
    _check_edits(body.get("context_management"))
    _check_blocks(body.get("system"), "system")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        if isinstance(message, dict):
            _check_blocks(message.get("content"), f"messages.{i}.content")


def _check_edits(context_management: Any) -> None:
    """Each ``context_management`` edit must be one this server applies (clearing thinking)."""
    edits = context_management.get("edits") if isinstance(context_management, dict) else None
    for i, edit in enumerate(edits if isinstance(edits, list) else ()):
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind != schemas.CLEAR_THINKING:
            raise InvalidRequestError(
                f"context_management.edits.{i}.type: {kind!r:.60} is not supported by this server; "
                f"only {schemas.CLEAR_THINKING}.",
                param=f"context_management.edits.{i}.type",
            )


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


def build_turns(body: schemas.MessagesBody | schemas.CountTokensBody) -> tuple[ChatMessage, ...]:
    if not body.messages:
        raise InvalidRequestError("messages: at least one message is required.", param="messages")
    if ends_in_prefill(body):
        _check_prefill(body.messages[-1], len(body.messages) - 1)
    kept = kept_thinking(body)
    turns = [turn for i, message in enumerate(body.messages) for turn in _turns(message, i, i in kept)]
    system = _system_text(body.system)
    if system is not None:
        turns.insert(0, ChatMessage(role="system", content=system))
    return tuple(turns)


def _check_prefill(message: schemas.MessageParam, index: int) -> None:
    """A prefill is text the reply continues: no tool calls in it, no trailing whitespace
    (Anthropic's rule: the continuation would start mid-whitespace)."""
    where = f"messages.{index}.content"
    content = message.content
    blocks = [schemas.TextBlock(text=content)] if isinstance(content, str) else content
    if any(isinstance(block, schemas.ToolUseBlock) for block in blocks):
        raise InvalidRequestError(
            f"{where}: a final assistant turn (a prefill) cannot hold tool_use blocks.", param=where
        )
    texts = [block.text for block in blocks if isinstance(block, schemas.TextBlock)]
    if texts and texts[-1] != texts[-1].rstrip():
        raise InvalidRequestError(f"{where}: final assistant content cannot end with trailing whitespace.", param=where)


def _system_text(system: str | list[schemas.TextBlock] | None) -> str | None:
    if system is None:
        return None
    if isinstance(system, str):
        return system or None
    text = SYSTEM_BLOCK_SEPARATOR.join(block.text for block in system)
    return text or None


def kept_thinking(body: schemas.MessagesBody | schemas.CountTokensBody) -> set[int]:
    """The indices of the assistant messages whose thinking reaches the template (as the turn's
    reasoning, which the template may still leave out): with a ``clear_thinking`` edit, ``keep``
    all of them or the last ``value`` that have some (the last one without ``keep``); without
    one, none (earlier thinking is cleared, as chat templates clear it)."""
    edits = body.context_management.edits if body.context_management is not None else None
    if not edits:
        return set()
    keep = edits[-1].keep
    thinking = [i for i, message in enumerate(body.messages) if _thinking_text(message)]
    if keep == "all" or isinstance(keep, schemas.AllThinkingTurns):
        return set(thinking)
    num_kept = 1 if keep is None else keep.value
    return set(thinking[-num_kept:]) if num_kept > 0 else set()


def _thinking_text(message: schemas.MessageParam) -> str:
    """An assistant message's thinking blocks' text (empty when the client omitted it)."""
    if message.role != "assistant" or isinstance(message.content, str):
        return ""
    return "".join(block.thinking for block in message.content if isinstance(block, schemas.ThinkingBlock))


def _turns(message: schemas.MessageParam, index: int, keep_thinking: bool = False) -> list[ChatMessage]:
    """One Anthropic message as chat turns: an assistant message is one turn with its calls (and
    its thinking as the turn's reasoning when ``keep_thinking``); a user message's ``tool_result``
    blocks become ``tool`` turns, in order among its text."""
    content = message.content
    if isinstance(content, str):
        return [ChatMessage(role=message.role, content=content)]
    where = f"messages.{index}.content"
    if message.role == "assistant":
        turn = _assistant_turn(content, where)
        return [attrs.evolve(turn, reasoning=_thinking_text(message)) if keep_thinking else turn]
    turns: list[ChatMessage] = []
    parts: list[ContentPart] = []
    for j, block in enumerate(content):
        if isinstance(block, schemas.ToolResultBlock):
            if parts:
                turns.append(ChatMessage(role="user", content=tuple(parts)))
                parts = []
            content = tool_result_content(block, image_part)
            turns.append(ChatMessage(role="tool", content=content, tool_call_id=block.tool_use_id))
        elif (part := _part(block, f"{where}.{j}", "user")) is not None:
            parts.append(part)
    if parts or not turns:
        turns.append(ChatMessage(role="user", content=tuple(parts)))
    return turns


def _assistant_turn(content: list[schemas.Block], where: str) -> ChatMessage:
    parts: list[ContentPart] = []
    calls: list[CalledTool] = []
    for j, block in enumerate(content):
        if isinstance(block, schemas.ToolUseBlock):
            calls.append(CalledTool(id=block.id, name=block.name, arguments=tool_arguments(block)))
        elif (part := _part(block, f"{where}.{j}", "assistant")) is not None:
            parts.append(part)
    return ChatMessage(role="assistant", content=tuple(parts), tool_calls=tuple(calls))


def _part(block: schemas.Block, where: str, role: str) -> ContentPart | None:
    """A block as an engine content part; None for what templates never see (thinking)."""
    if isinstance(block, schemas.TextBlock):
        return TextPart(text=block.text)
    if isinstance(block, schemas.ImageBlock):
        return image_part(block)
    if isinstance(block, schemas.ThinkingBlock | schemas.RedactedThinkingBlock):
        return None  # earlier turns' reasoning: accepted, and dropped as chat templates do
    kind = "tool_use" if isinstance(block, schemas.ToolUseBlock) else "tool_result"
    raise InvalidRequestError(f"{where}: {kind} blocks are not allowed in {role} messages.", param=where)


def image_part(block: schemas.ImageBlock) -> ImagePart:
    """An image by reference: a data URL of base64 bytes, or the URL as given."""
    source = block.source
    if isinstance(source, schemas.Base64Source):
        ref = f"data:{source.media_type};base64,{source.data}"
    else:
        ref = source.url
    return ImagePart(ref=ref, content_hash=_content_hash(ref))
