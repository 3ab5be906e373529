"""Parse and check OpenAI request bodies into a prompt and :class:`SamplingParams`.

Strict, like OpenAI's own API: an unknown field is a 400 naming it, a wrong type is a 400
naming the field and the type expected, and a field we cannot honour yet is a 400 rather
than being silently ignored.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from ..core.params import SamplingParams
from ..errors import InvalidRequestError, ModelNotFoundError
from ..messages import ChatMessage

_SAMPLING_FIELDS = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k",
    "min_p", "seed", "repetition_penalty", "stop", "stop_token_ids", "n", "user",
}  # fmt: skip
#: Fields a later version honours; accepted today only at their "off" value.
_NOT_YET = {
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None,),
}
_CHAT_FIELDS = _SAMPLING_FIELDS | {"messages", "max_completion_tokens"}
_COMPLETION_FIELDS = _SAMPLING_FIELDS | {"prompt"}
_ROLES = ("system", "developer", "user", "assistant")


@attrs.frozen(kw_only=True)
class ParsedRequest:
    """What a route needs from a body, checked."""

    prompt: str | tuple[ChatMessage, ...]
    params: SamplingParams
    stream: bool
    include_usage: bool


def parse_chat(body: Any, *, model_name: str) -> ParsedRequest:
    body = _check_body(body, _CHAT_FIELDS, model_name)
    max_tokens = _opt(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _opt(body, "max_tokens", int)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty array of message objects.", "messages")
    prompt = tuple(_parse_message(m, i) for i, m in enumerate(messages))
    return _parsed(body, prompt, max_tokens)


def parse_completion(body: Any, *, model_name: str) -> ParsedRequest:
    body = _check_body(body, _COMPLETION_FIELDS, model_name)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _bad("prompt must be a string (or an array holding one string).", "prompt")
    return _parsed(body, prompt, _opt(body, "max_tokens", int))


def _check_body(body: Any, allowed: set[str], model_name: str) -> dict:
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", None)
    for name in body:
        if name in _NOT_YET:
            if body[name] not in _NOT_YET[name]:
                raise _bad(f"{name} is not supported by this server yet.", name, "unsupported_parameter")
        elif name not in allowed:
            raise _bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise _bad("model is required and must be a string.", "model")
    if model != model_name:
        raise ModelNotFoundError(model)
    return body


def _parsed(body: dict, prompt: str | tuple[ChatMessage, ...], max_tokens: int | None) -> ParsedRequest:
    if _opt(body, "n", int) not in (None, 1):
        raise _bad("Only n=1 is supported by this server yet.", "n", "unsupported_parameter")
    stream = bool(_opt(body, "stream", bool))
    options = _opt(body, "stream_options", dict) or {}
    if options and not stream:
        raise _bad("stream_options is only allowed when stream is true.", "stream_options")
    unknown = set(options) - {"include_usage"}
    if unknown:
        raise _bad(f"Unrecognized stream option: {sorted(unknown)[0]}", "stream_options")
    include_usage = bool(_opt(options, "include_usage", bool, "stream_options.include_usage"))
    return ParsedRequest(
        prompt=prompt, params=_sampling(body, max_tokens), stream=stream, include_usage=include_usage
    )


def _sampling(body: dict, max_tokens: int | None) -> SamplingParams:
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
    }
    params = SamplingParams(
        max_tokens=max_tokens,
        stop=stop_tuple,
        stop_token_ids=tuple(_int_list(body.get("stop_token_ids"), "stop_token_ids")),
        **{k: v for k, v in fields.items() if v is not None},
    )
    return params


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
    return ChatMessage(role=role, content=content)


def _text_part(part: Any, where: str) -> str:
    if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise _bad(f"{where}: content part of type {kind!r:.50} is not supported by this model.", where)
    return part["text"]


_TYPE_NAMES = {int: "an integer", float: "a number", bool: "a boolean", dict: "an object"}


def _opt(body: dict, name: str, kind: type, param: str | None = None) -> Any:
    """The field's value if present and of the right type, else None; wrong type -> 400."""
    value = body.get(name)
    if value is None:
        return None
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value)
    if not ok:
        raise _bad(f"{param or name} must be {_TYPE_NAMES[kind]}, got {type(value).__name__}.", param or name)
    return float(value) if kind is float else value


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
