"""Parse and check OpenAI request bodies into a prompt and :class:`SamplingParams`.

Strict, like OpenAI's own API: an unknown field is a 400 naming it, a wrong type is a 400
naming the field and the type expected, and a field we cannot honour yet is a 400 rather
than being silently ignored. Ranges and token ids are checked once, by admission
(:meth:`SamplingParams.check` and ``check_token_ids``), for HTTP and library callers alike;
only what OpenAI bounds per route (completions' ``logprobs`` <= 5, ``n``) is checked here.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from ..core.params import SamplingParams
from ..errors import InvalidRequestError, ModelNotFoundError
from ..messages import ChatMessage

_SAMPLING_FIELDS = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "repetition_penalty", "stop", "stop_token_ids", "n", "user",
    "presence_penalty", "frequency_penalty", "logit_bias", "min_tokens", "ignore_eos", "cache_salt",
    "stream_interval",
}  # fmt: skip
#: Legacy completions return at most this many alternatives per token (OpenAI's limit).
MAX_COMPLETION_LOGPROBS = 5
#: Most logit_bias entries one request may give: the bias is applied every step, so this
#: bounds the per-step work one request adds (a ban list of a thousand tokens still fits).
MAX_LOGIT_BIAS_ENTRIES = 1024
#: A logit_bias key: a decimal token id (ten digits bound int() and any real vocabulary).
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")
#: Fields a later version honours; accepted today only at their "off" value.
_NOT_YET = {
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None,),
}
_CHAT_FIELDS = _SAMPLING_FIELDS | {"messages", "max_completion_tokens", "logprobs", "top_logprobs"}
_COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt", "logprobs"}
_ROLES = ("system", "developer", "user", "assistant")
#: OpenAI message fields this server cannot act on (no tools, audio or refusals): accepted only
#: when off, as openai-python writes them when an answer is sent back as the next turn's input.
_MESSAGE_OFF_ONLY = {
    "refusal": (None, ""),
    "tool_calls": (None, []),
    "tool_call_id": (None,),
    "function_call": (None,),
    "audio": (None,),
    "annotations": (None, []),
}
_MESSAGE_FIELDS = {"role", "content", "name", *_MESSAGE_OFF_ONLY}
#: Longest participant ``name`` accepted (OpenAI's schema has no bound; templates paste it).
MAX_NAME_CHARS = 256


@attrs.frozen(kw_only=True)
class ParsedRequest:
    """What a route needs from a body, checked."""

    prompt: str | tuple[ChatMessage, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool
    #: Choices asked for: the route runs this many engine requests for the prompt.
    n: int = 1


def parse_chat(body: Any, *, model_name: str, max_n: int) -> ParsedRequest:
    body = _check_body(body, _CHAT_FIELDS, model_name)
    max_tokens = _opt(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _opt(body, "max_tokens", int)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty array of message objects.", "messages")
    prompt = tuple(_parse_message(m, i) for i, m in enumerate(messages))
    return _parsed(body, prompt, max_tokens, max_n, _chat_logprobs(body))


def parse_completion(body: Any, *, model_name: str, max_n: int) -> ParsedRequest:
    body = _check_body(body, _COMPLETION_FIELDS, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt must be a string (or an array holding one string).", "prompt")
    logprobs = _opt(body, "logprobs", int)
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        raise _bad(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {logprobs}.", "logprobs")
    return _parsed(body, prompt, _opt(body, "max_tokens", int), max_n, logprobs)


def _chat_logprobs(body: dict) -> int | None:
    """Chat's ``logprobs`` (bool) and ``top_logprobs`` (int) as SamplingParams.logprobs."""
    wanted = bool(_opt(body, "logprobs", bool))
    top = _opt(body, "top_logprobs", int)
    if top is not None and not wanted:
        raise _bad("top_logprobs is only allowed when logprobs is true.", "top_logprobs")
    if not wanted:
        return None
    return 0 if top is None else top


def _check_body(body: Any, allowed: set[str], model_name: str) -> dict:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", None)
    for name in body:
        if name in _NOT_YET:
            if not _is_off_value(body[name], _NOT_YET[name]):
                raise _bad(f"{name} is not supported by this server yet.", name, "unsupported_parameter")
        elif name not in allowed:
            raise _bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model is required and must be a string.", "model")
    if model != model_name:
        raise ModelNotFoundError(model)
    return body


def _is_off_value(value: Any, off_values: tuple) -> bool:
    """Equal to one of the "off" values *and* of its type (``1`` is not ``True``, ``0.0`` is
    not ``0`` for an integer field)."""
    return any(type(value) is type(off) and value == off for off in off_values)


def _parsed(
    body: dict, prompt: str | tuple[ChatMessage, ...], max_tokens: int | None, max_n: int, logprobs: int | None
) -> ParsedRequest:
    n = _opt(body, "n", int)
    n = 1 if n is None else n
    if not 1 <= n <= max_n:
        raise _bad(f"n must be between 1 and {max_n}, got {n}.", "n")
    _opt(body, "user", str)  # accepted for OpenAI compatibility; only its type is checked
    stream = bool(_opt(body, "stream", bool))
    options = _opt(body, "stream_options", dict) or {}
    if options and not stream:
        raise _bad("stream_options is only allowed when stream is true.", "stream_options")
    unknown = set(options) - {"include_usage"}
    if unknown:
        raise _bad(f"Unrecognized stream option: {sorted(unknown)[0]}", "stream_options")
    include_usage = bool(_opt(options, "include_usage", bool, "stream_options.include_usage"))
    params = _sampling(body, max_tokens, logprobs)
    return ParsedRequest(prompt=prompt, params=params, stream=stream, include_usage=include_usage, n=n)


def _sampling(body: dict, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    stop = body.get("stop")
    stop_tuple = (stop,) if isinstance(stop, str) else _str_list(stop, "stop")
    top_k = _opt(body, "top_k", int)
    fields = {
        "temperature": _opt(body, "temperature", float),
        "top_p": _opt(body, "top_p", float),
        "top_k": 0 if top_k == -1 else top_k,  # vLLM's "-1 disables top-k"
        "min_p": _opt(body, "min_p", float),
        "seed": _opt(body, "seed", int),
        "repetition_penalty": _opt(body, "repetition_penalty", float),
        "presence_penalty": _opt(body, "presence_penalty", float),
        "frequency_penalty": _opt(body, "frequency_penalty", float),
        "min_tokens": _opt(body, "min_tokens", int),
        "ignore_eos": _opt(body, "ignore_eos", bool),
        "stream_interval": _opt(body, "stream_interval", int),
        "cache_salt": _opt(body, "cache_salt", str),
    }
    return SamplingParams(
        max_tokens=max_tokens,
        stop=stop_tuple,
        stop_token_ids=tuple(_int_list(body.get("stop_token_ids"), "stop_token_ids")),
        logit_bias=_logit_bias(body.get("logit_bias")),
        logprobs=logprobs,
        **{k: v for k, v in fields.items() if v is not None},
    )


def _logit_bias(value: Any) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}`` object as (token id, bias) pairs, in the body's order."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise _bad(f"logit_bias must be an object, got {type(value).__name__}.", "logit_bias")
    if len(value) > MAX_LOGIT_BIAS_ENTRIES:
        raise _bad(f"logit_bias may name at most {MAX_LOGIT_BIAS_ENTRIES} tokens, got {len(value)}.", "logit_bias")
    pairs: dict[int, float] = {}
    for key, bias in value.items():
        if not _TOKEN_ID_KEY.fullmatch(key):
            raise _bad(f"logit_bias keys must be token ids (decimal integers), got {key!r:.50}.", "logit_bias")
        token_id = int(key)
        if token_id in pairs:
            raise _bad(f"logit_bias names token id {token_id} more than once.", "logit_bias")
        bias = _opt(value, key, float, "logit_bias")
        if bias is None:
            raise _bad(f"logit_bias values must be numbers, got null for token id {token_id}.", "logit_bias")
        pairs[token_id] = bias
    return tuple(pairs.items())


def _parse_message(message: Any, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object.", where)
    role = message.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r:.50}.", f"{where}.role")
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(_text_part(part, f"{where}.content[{i}]") for i, part in enumerate(content))
    if not isinstance(content, str):
        raise _bad(f"{where}.content must be a string or an array of text parts.", f"{where}.content")
    _check_message_fields(message, where)
    return ChatMessage(role=role, content=content, name=_message_name(message, where))


def _check_message_fields(message: dict, where: str) -> None:
    """Every field of a message is one this server acts on, or off."""
    for key, value in message.items():
        if key not in _MESSAGE_FIELDS:
            raise _bad(f"Unrecognized field in {where}: {key!r:.60}", f"{where}.{key:.60}", "unknown_parameter")
        off = _MESSAGE_OFF_ONLY.get(key)
        if off is not None and not _is_off_value(value, off):
            raise _bad(f"{where}.{key} is not supported by this server yet.", f"{where}.{key}", "unsupported_parameter")


def _message_name(message: dict, where: str) -> str | None:
    name = message.get("name")
    if name is not None and (not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS):
        raise _bad(f"{where}.name must be a string of 1 to {MAX_NAME_CHARS} characters.", f"{where}.name")
    return name


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise _bad(f"{where}: content part of type {kind!r:.50} is not supported by this model.", where)
    return part["text"]


_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean", dict: "an object"}


def _opt(body: dict, name: str, kind: type, param: str | None = None) -> Any:
    """The field's value if present and of the right type, else None; wrong type -> 400."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and _finite(value)
    if not ok:
        raise _bad(f"{param or name} must be {_TYPE_NAMES[kind]}, got {type(value).__name__}.", param or name)
    return float(value) if kind is float else value


def _finite(value: int | float) -> bool:
    """A finite number that fits a float (a 400-digit integer does not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _str_list(value: Any, name: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad(f"{name} must be a string or an array of strings.", name)
    return tuple(value)


def _int_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise _bad(f"{name} must be an array of integers.", name)
    return value


def _bad(message: str, param: str | None, code: str | None = None) -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)
