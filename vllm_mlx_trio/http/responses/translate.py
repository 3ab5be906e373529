"""An OpenAI Responses body -> the engine's chat turns and :class:`SamplingParams`.

Strict like the chat route: an unknown field is a 400 naming it (``unknown_parameter``), a
field this server cannot honour is a 400 naming it (``unsupported_parameter``), and the
model must be the served one. The turns are ``instructions`` (a system turn; as in OpenAI's
API, never carried over from a previous response), then the stored conversation of
``previous_response_id``, then ``input``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs
import msgspec

from ...core.params import SamplingParams
from ...errors import InvalidRequestError
from ...messages import CalledTool, ChatMessage, ChatPrompt, ContentPart, ImagePart, TextPart
from ...output_format import OutputFormat
from ..model_names import ServedNames
from ..openai.requests import _content_hash
from . import schemas
from .tool_kinds import CUSTOM_INPUT, flat_name
from .tools import ResponsesPlan, responses_plan

_AT = re.compile(r"^(?P<text>.*?)(?: - at `\$(?P<path>.*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]*)`")


@attrs.frozen(kw_only=True)
class ResponsesRequest:
    """What the Responses route needs from a body, checked."""

    body: schemas.ResponsesBody
    #: This request's own turns (``input``), without instructions or earlier responses.
    turns: tuple[ChatMessage, ...]
    params: SamplingParams
    plan: ResponsesPlan

    @property
    def stream(self) -> bool:
        return bool(self.body.stream)

    @property
    def store(self) -> bool:
        return self.body.store is not False  # OpenAI's default is to store

    def prompt(self, history: tuple[ChatMessage, ...]) -> ChatPrompt:
        """The prompt sent to the engine after ``history`` (a previous response's conversation); a
        probe with no turns at all (empty ``input``, no instructions) is one empty user turn."""
        system = () if self.body.instructions is None else (ChatMessage(role="system", content=self.body.instructions),)
        turns = _merged_calls((*system, *history, *self.turns)) or (ChatMessage(role="user", content=""),)
        return ChatPrompt(messages=turns, tools=self.plan.tools, template_kwargs=self.plan.template_kwargs)


def parse_responses(body: Any, *, model_names: ServedNames, output: OutputFormat) -> ResponsesRequest:
    decoded = _decode(body, model_names)
    _check_unsupported(decoded)
    plan = responses_plan(decoded, output)
    turns = _turns(decoded.input)
    fields = {"temperature": decoded.temperature, "top_p": decoded.top_p}
    params = SamplingParams(
        max_tokens=decoded.max_output_tokens,
        constraint=plan.constraint,
        adapter=model_names.adapter(decoded.model),
        **{name: value for name, value in fields.items() if value is not None},
    )
    return ResponsesRequest(body=decoded, turns=turns, params=params, plan=plan)


def _merged_calls(turns: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
    """Consecutive assistant turns whose later ones only call tools become one turn (the
    Responses API sends a message item and its function_call items separately)."""
    merged: list[ChatMessage] = []
    for turn in turns:
        previous = merged[-1] if merged else None
        if previous is not None and previous.role == turn.role == "assistant" and turn.tool_calls and not turn.content:
            merged[-1] = attrs.evolve(previous, tool_calls=(*previous.tool_calls, *turn.tool_calls))
        else:
            merged.append(turn)
    return tuple(merged)


def _decode(body: Any, model_names: ServedNames) -> schemas.ResponsesBody:
    if not isinstance(body, dict):
        raise InvalidRequestError("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str):
        raise InvalidRequestError("model is required and must be a string.", param="model")
    model_names.resolve(model)
    return convert(body, schemas.ResponsesBody, "")


def convert(value: Any, schema: type, where: str) -> Any:
    """``msgspec.convert``, its complaint as a 400 whose ``param`` is the path (``input[0].role``)."""
    try:
        return msgspec.convert(value, schema)
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:
        match = _AT.match(str(exc))
        assert match is not None  # the pattern matches any text
        path = f"{where}{match['path'] or ''}".lstrip(".")
        unknown = _UNKNOWN.match(match["text"])
        if unknown is not None:
            name = f"{path}.{unknown['name']}" if path else unknown["name"]
            raise InvalidRequestError(
                f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
            ) from None
        text = match["text"]
        raise InvalidRequestError(f"{path}: {text}" if path else text, param=path or None) from None


def _unsupported(name: str, what: str) -> InvalidRequestError:
    return InvalidRequestError(f"{name}: {what}", param=name, code="unsupported_parameter")


def _check_unsupported(body: schemas.ResponsesBody) -> None:
    """Fields that would change the answer and that this server cannot honour (yet)."""
    if body.background:
        raise _unsupported("background", "background responses are not supported by this server.")
    if body.truncation == "auto":
        raise _unsupported("truncation", "automatic truncation is not supported; use 'disabled'.")
    if body.top_logprobs:
        raise _unsupported("top_logprobs", "logprobs are not supported on /v1/responses yet.")
    for name in body.include or ():
        if name not in schemas.ACCEPTED_INCLUDES:
            raise _unsupported("include", f"{name!r:.60} is not supported by this server.")
    if body.max_tool_calls is not None:
        raise _unsupported("max_tool_calls", "a cap on tool calls is not supported; use parallel_tool_calls.")


def _turns(input_: str | list[dict[str, Any]]) -> tuple[ChatMessage, ...]:
    if isinstance(input_, str):
        return (ChatMessage(role="user", content=input_),)
    turns = (_item(item, f"input[{i}]") for i, item in enumerate(input_))
    return tuple(turn for turn in turns if turn is not None)


def _item(item: dict[str, Any], where: str) -> ChatMessage | None:
    kind = item.get("type", "message")
    if kind == "function_call":
        call = convert(item, schemas.FunctionCallItem, where)
        called = CalledTool(id=call.call_id, name=flat_name(call.namespace, call.name), arguments=call.arguments)
        return ChatMessage(role="assistant", content=(), tool_calls=(called,))
    if kind == "custom_tool_call":
        custom = convert(item, schemas.CustomToolCallItem, where)
        arguments = json.dumps({CUSTOM_INPUT: custom.input}, ensure_ascii=False)
        called = CalledTool(id=custom.call_id, name=flat_name(custom.namespace, custom.name), arguments=arguments)
        return ChatMessage(role="assistant", content=(), tool_calls=(called,))
    if kind in ("function_call_output", "custom_tool_call_output"):
        schema = schemas.FunctionCallOutputItem if kind == "function_call_output" else schemas.CustomToolCallOutputItem
        result = convert(item, schema, where)
        return ChatMessage(role="tool", content=_output_text(result.output), tool_call_id=result.call_id)
    if kind == "reasoning":
        convert(item, schemas.ReasoningItem, where)
        return None  # earlier reasoning: accepted, and dropped as chat templates do
    if kind != "message":
        raise InvalidRequestError(f"{where}.type: unknown input item type {kind!r:.60}.", param=f"{where}.type")
    message = convert(item, schemas.MessageItem, where)
    content = message.content
    if isinstance(content, str):
        return ChatMessage(role=message.role, content=content)
    parts = tuple(_part(part, f"{where}.content[{j}]") for j, part in enumerate(content))
    return ChatMessage(role=message.role, content=parts)


def _output_text(output: str | list[schemas.Content]) -> str:
    if isinstance(output, str):
        return output
    return "".join(part.text for part in output if isinstance(part, schemas.InputText | schemas.OutputText))


def _part(part: schemas.Content, where: str) -> ContentPart:
    if isinstance(part, schemas.InputText | schemas.OutputText):
        return TextPart(text=part.text)
    if isinstance(part, schemas.Refusal):
        return TextPart(text=part.refusal)
    if part.image_url is None:
        raise _unsupported(f"{where}.file_id", "images by file_id are not supported; send image_url.")
    return ImagePart(ref=part.image_url, content_hash=_content_hash(part.image_url))
