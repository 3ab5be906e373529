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

from ..errors import InvalidRequestError
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


def explain(text: str, body: dict, schema: type) -> InvalidRequestError:
    """The 400 for msgspec's error ``text`` on ``body`` decoded as ``schema``."""
    match = _AT.search(text)
    path = [a or b for a, b in _STEP.findall(match["path"])] if match else []
    if not path:  # the pre-checks catch every top-level fault; kept as a safety net
        return bad(f"The request body does not match the API: {text}", None)
    field, raw = path[0], body.get(path[0])
    if field == "messages":
        return _message_error(raw, path[1:], text)
    if field in _SHAPE_MESSAGES:
        return bad(_SHAPE_MESSAGES[field], field)
    if field == "logit_bias":
        return _raised(logit_bias_pairs, raw) or bad(f"logit_bias is not valid: {text}", field)
    if field == "stream_options":
        return _stream_options_error(raw, body)
    kind = schemas.field_kind(schema, field)
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


def _message_error(messages: Any, path: list[str], text: str) -> InvalidRequestError:
    """The 400 for a fault inside ``messages`` (``path`` below it: index, field, part...)."""
    if not path or not isinstance(messages, list):
        return bad("messages must be a non-empty array of message objects.", "messages")
    where = f"messages[{path[0]}]"
    message = messages[int(path[0])]
    if not isinstance(message, dict):
        return bad(f"{where} must be an object.", where)
    field = path[1] if len(path) > 1 else None
    if field is None and "unknown field" in text:
        key = next(k for k in message if k not in _MESSAGE_NAMES)
        return bad(f"Unrecognized field in {where}: {key!r:.60}", f"{where}.{key:.60}", "unknown_parameter")
    if field == "role" or (field is None and "`role`" in text):
        roles = ", ".join(schemas.ROLES)
        return bad(f"{where}.role must be one of {roles}, got {message.get('role')!r:.50}.", f"{where}.role")
    if field == "content" and len(path) > 2:
        return part_error(message["content"][int(path[2])], f"{where}.content[{path[2]}]")
    if field == "content" or field is None:
        return bad(f"{where}.content must be a string or an array of text parts.", f"{where}.content")
    if field == "name":
        return bad(f"{where}.name must be a string of 1 to {schemas.MAX_NAME_CHARS} characters.", f"{where}.name")
    return bad(f"{where}.{field} is not supported by this server yet.", f"{where}.{field}", "unsupported_parameter")


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
