"""msgspec's validation errors, worded as this server words a bad request.

msgspec says *where* a body is wrong (``Expected `int | null`, got `str` - at `$.max_tokens```);
the answer a client gets names the field and what was expected in our own words, with the
value it sent, and the same ``param`` path as ever (``messages[2].content[0]``). The message
is built from the raw body at that path, never from msgspec's text, so a msgspec release
cannot change what a client reads.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from ...errors import InvalidRequestError
from . import schemas

#: Most logit_bias entries one request may give: the bias is applied every step, so this
#: bounds the per-step work one request adds (a ban list of a thousand tokens still fits).
MAX_LOGIT_BIAS_ENTRIES = 1024
#: A logit_bias key: a decimal token id (ten digits bound int() and any real vocabulary).
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")
_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
_AT = re.compile(r" - at `\$(?P<path>.*)`$")
_STEP = re.compile(r"\.([^.\[]+)|\[([0-9]+|\.\.\.)\]")
_MESSAGE_NAMES = schemas.field_names(schemas.MessageIn)


def bad(message: str, param: str | None, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def is_off_value(value: Any, off_values: tuple) -> bool:
    """Equal to one of the "off" values *and* of its type (``1`` is not ``True``, ``0.0`` is
    not ``0`` for an integer field)."""
    return any(type(value) is type(off) and value == off for off in off_values)


#: The order in which fields are checked, so a body with several faults gets the same answer
#: whatever the order of its keys (the order of the hand-written checks this replaced).
_SAMPLING_ORDER = (
    "n",
    "user",
    "stream",
    "stream_options",
    "stop",
    "top_k",
    "temperature",
    "top_p",
    "min_p",
    "seed",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "ignore_eos",
    "stream_interval",
    "cache_salt",
    "stop_token_ids",
    "logit_bias",
    *schemas.CONSTRAINT_FIELDS,
)
CHECK_ORDER = {
    schemas.ChatBody: (
        "max_completion_tokens",
        "max_tokens",
        "messages",
        "logprobs",
        "top_logprobs",
        *_SAMPLING_ORDER,
        *schemas.CHAT_AGENT_FIELDS,
        *schemas.CHAT_MEDIA_FIELDS,
    ),
    schemas.CompletionBody: ("prompt", "logprobs", "max_tokens", *_SAMPLING_ORDER),
}


def type_faults(body: dict, schema: type) -> dict[str, InvalidRequestError]:
    """Every top-level field that does not match its declaration, with its 400, in
    :data:`CHECK_ORDER` (never empty for a body msgspec refused: every field is checked)."""
    faults: dict[str, InvalidRequestError] = {}
    for name in CHECK_ORDER[schema]:
        if name not in body:
            continue
        if name == "messages":
            error = _messages_fault(body[name])
        else:
            text = mismatch({name: body[name]}, schema)
            error = explain(text, body, schema) if text else None
        if error:
            faults[name] = error
    return faults or {"": bad("The request body does not match the API.", None)}


def check_position(schema: type, param: str | None) -> int:
    """Where the field a ``param`` path starts with comes in :data:`CHECK_ORDER` (last if not in it)."""
    order = CHECK_ORDER[schema]
    name = re.split(r"[.\[]", param or "", maxsplit=1)[0]
    return order.index(name) if name in order else len(order)


def mismatch(value: Any, kind: Any) -> str | None:
    """msgspec's complaint about ``value`` as ``kind``, or None when it fits."""
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        return str(exc)
    except UnicodeEncodeError:  # a lone surrogate where msgspec matches a name; the answer quotes the original
        return mismatch(without_surrogates(value), kind)
    return None


def json_path(steps: list[str]) -> str:
    """``["tools", "1", "type"]`` as ``tools[1].type``."""
    out = steps[0]
    for step in steps[1:]:
        out += f"[{step}]" if step.isdigit() else f".{step}"
    return out


def explain(text: str, body: dict, schema: type) -> InvalidRequestError:
    """The 400 for msgspec's error ``text`` about one top-level field of ``body``."""
    match = _AT.search(text)
    path = [a or b for a, b in _STEP.findall(match["path"])] if match else []
    if not path:
        return bad(f"The request body does not match the API: {text}", None)
    field, raw = path[0], body.get(path[0])
    if field in _SHAPE_MESSAGES:
        return bad(_SHAPE_MESSAGES[field], field)
    if field == "logit_bias":
        return _raised(logit_bias_pairs, raw) or bad(f"logit_bias is not valid: {text}", field)
    if field == "stream_options":
        return _stream_options_error(raw, body)
    kind = schemas.field_kind(schema, field)
    if kind is None and len(path) > 1:
        where = json_path(path)
        return bad(f"{where}: {_AT.sub('', text)}", where)
    if kind is None:
        return bad(f"{field} is not valid: {text}", field)
    return bad(f"{field} must be {_TYPE_NAMES[kind]}, got {type(raw).__name__}.", field)


_SHAPE_MESSAGES = {
    "stop": "stop must be a string or an array of strings.",
    "stop_token_ids": "stop_token_ids must be an array of integers.",
    "prompt": "prompt must be a string (or an array holding one string).",
}


def _raised(check: Any, value: Any) -> InvalidRequestError | None:
    try:
        check(value)
    except InvalidRequestError as exc:
        return exc
    return None


def _stream_options_error(raw: Any, body: dict) -> InvalidRequestError:
    if not isinstance(raw, dict):
        return bad(f"stream_options must be an object, got {type(raw).__name__}.", "stream_options")
    if raw and body.get("stream") is not True:
        return bad("stream_options is only allowed when stream is true.", "stream_options")
    unknown = set(raw) - {"include_usage"}
    if unknown:
        return bad(f"Unrecognized stream option: {sorted(unknown)[0]}", "stream_options")
    kind = type(raw.get("include_usage")).__name__
    return bad(f"stream_options.include_usage must be a boolean, got {kind}.", "stream_options.include_usage")


def _messages_fault(messages: Any) -> InvalidRequestError | None:
    if not isinstance(messages, list):
        return bad("messages must be a non-empty array of message objects.", "messages")
    for index, message in enumerate(messages):
        error = _message_fault(message, f"messages[{index}]")
        if error:
            return error
    return None


def _message_fault(message: Any, where: str) -> InvalidRequestError | None:
    """A message's first fault: its role, its content (part by part), its fields, its name."""
    if not isinstance(message, dict):
        return bad(f"{where} must be an object.", where)
    role = message.get("role")
    if not isinstance(role, str) or role not in schemas.ROLES:
        return bad(f"{where}.role must be one of {', '.join(schemas.ROLES)}, got {role!r:.50}.", f"{where}.role")
    content = message.get("content")
    if isinstance(content, list):
        for j, part in enumerate(content):
            refused_kind = isinstance(part, dict) and part.get("type") == "input_audio"  # no audio runner yet
            if refused_kind or mismatch(part, schemas.ContentPartIn):
                return part_error(part, f"{where}.content[{j}]")
    elif not isinstance(content, str) and not (content is None and _content_may_be_null(message)):
        return bad(f"{where}.content must be a string or an array of text parts.", f"{where}.content")
    for key, value in message.items():
        if key not in _MESSAGE_NAMES:
            return bad(f"Unrecognized field in {where}: {key!r:.60}", f"{where}.{key:.60}", "unknown_parameter")
        off = schemas.MESSAGE_OFF.get(key)
        if off is not None and not is_off_value(value, off):
            return bad(f"{where}.{key} is not supported by this server yet.", f"{where}.{key}", "unsupported_parameter")
    if mismatch(message.get("tool_calls"), list[schemas.ToolCall] | None):
        shape = '{"id", "type": "function", "function": {"name", "arguments"}}'
        return bad(f"{where}.tool_calls must be an array of {shape} objects.", f"{where}.tool_calls")
    for key in ("tool_call_id", "reasoning_content", "reasoning"):
        if mismatch(message.get(key), str | None):
            return bad(f"{where}.{key} must be a string.", f"{where}.{key}")
    if mismatch(message.get("name"), schemas.Name | None):
        return bad(f"{where}.name must be a string of 1 to {schemas.MAX_NAME_CHARS} characters.", f"{where}.name")
    return None


def _content_may_be_null(message: dict) -> bool:
    """An assistant reply sent back: only calls, or only reasoning, has null content."""
    return bool(message.get("tool_calls") or message.get("reasoning_content") or message.get("reasoning"))


def part_error(part: Any, where: str) -> InvalidRequestError:
    """A content part this model cannot take (or that is not a content part at all)."""
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    return bad(f"{where}: content part of type {kind!r:.50} is not supported by this model.", where)


def logit_bias_pairs(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` object as (token id, bias) pairs, in the body's order."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad(f"logit_bias must be an object, got {type(value).__name__}.", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad(f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}.", "logit_bias")
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        if not _TOKEN_ID_KEY.fullmatch(key):
            raise bad(f"logit_bias keys must be token ids (decimal integers), got {key!r:.50}.", "logit_bias")
        token_id = int(key)
        if token_id in pairs:
            raise bad(f"logit_bias names token id {token_id} more than once.", "logit_bias")
        if bias is None:
            raise bad(f"logit_bias values must be numbers, got null for token id {token_id}.", "logit_bias")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not _finite(bias):
            raise bad(f"logit_bias must be a number, got {type(bias).__name__}.", "logit_bias")
        pairs[token_id] = float(bias)
    return tuple(pairs.items())


def _finite(value: int | float) -> bool:
    """A finite number that fits a float (a 400-digit integer does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def without_surrogates(value: Any) -> Any:
    """``value`` with lone surrogates in its strings and keys replaced, for msgspec to find
    where the fault is (it cannot match a name holding one); the answer quotes the original."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, list):
        return [without_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {without_surrogates(k): without_surrogates(v) for k, v in value.items()}
    return value
