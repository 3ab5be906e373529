"""Turn OpenAI request bodies into a prompt and :class:`SamplingParams`.

The shapes are declared in :mod:`.schemas` and checked by msgspec. Strict, like OpenAI's own
API: an unknown field is a 400 naming it, a wrong type is a 400 naming the field and the type
expected (:mod:`.schema_errors` words msgspec's errors the way this server always has), and a
field we cannot honour yet is a 400 rather than being silently ignored. Ranges and token ids
are checked once, by admission (:meth:`SamplingParams.check` and ``check_token_ids``), for
HTTP and library callers alike; only what OpenAI bounds per route (completions' ``logprobs``
<= 5, ``n``) is checked here.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import attrs
import msgspec

from ...core.constraint import ConstraintSpec, canonical_json
from ...core.params import SamplingParams
from ...errors import InvalidRequestError
from ...messages import ChatMessage, ChatPrompt, ContentPart, ImagePart, TextPart, VideoPart
from ..model_names import ServedNames
from . import extensions, schemas
from .schema_errors import bad, check_position, is_off_value, logit_bias_pairs, part_error, type_faults
from .tool_requests import ToolUse, chat_prompt, tool_message, tool_use, with_tool_constraint

#: Legacy completions return at most this many alternatives per token (OpenAI's limit).
MAX_COMPLETION_LOGPROBS = 5
_CHAT_NAMES = schemas.field_names(schemas.ChatBody)
_COMPLETION_NAMES = schemas.field_names(schemas.CompletionBody)


@attrs.frozen(kw_only=True)
class ParsedRequest:
    """What a route needs from a body, checked."""

    prompt: str | ChatPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    #: Choices asked for: the route runs this many engine requests for the prompt.
    n: int = 1
    #: vLLM's extension fields the body set (:mod:`.extensions`); already folded into ``params``.
    extensions: extensions.Extensions = extensions.Extensions()
    #: Chat only: the tools and how the reply's calls are parsed (None: no tools).
    tools: ToolUse | None = None
    #: The model name the reply carries: the one the request sent.
    model: str = ""


def parse_chat(
    body: Any, *, model_names: ServedNames, max_n: int, tool_parser: str | None = None, unknown_fields: str = "reject"
) -> ParsedRequest:
    """A chat body; ``tool_parser`` is the model's (None: requests that need one get a 400)."""
    body, ext = extensions.split(body, _CHAT_NAMES, chat=True, unknown_fields=unknown_fields)
    build = partial(_chat, max_n=max_n, tool_parser=tool_parser)
    parsed = _parse(body, schemas.ChatBody, _CHAT_NAMES, model_names, build, schemas.NOT_YET_OFF)
    return _with_extensions(parsed, ext)


def parse_completion(
    body: Any, *, model_names: ServedNames, max_n: int, unknown_fields: str = "reject"
) -> ParsedRequest:
    body, ext = extensions.split(body, _COMPLETION_NAMES, chat=False, unknown_fields=unknown_fields)
    build = partial(_completion, max_n=max_n)
    parsed = _parse(body, schemas.CompletionBody, _COMPLETION_NAMES, model_names, build, schemas.COMPLETION_OFF)
    return _with_extensions(parsed, ext)


def _with_extensions(parsed: ParsedRequest, ext: extensions.Extensions) -> ParsedRequest:
    params = attrs.evolve(parsed.params, **ext.params())
    return attrs.evolve(parsed, params=params, extensions=ext)


def _chat(chat: schemas.ChatBody, body: dict, *, max_n: int, tool_parser: str | None = None) -> ParsedRequest:
    max_tokens = chat.max_completion_tokens if chat.max_completion_tokens is not None else chat.max_tokens
    if not chat.messages:
        raise bad("messages must be a non-empty array of message objects.", "messages")
    messages = tuple(_message(m, body["messages"][i], i) for i, m in enumerate(chat.messages))
    use = tool_use(chat, body, tool_parser)
    prompt = attrs.evolve(chat_prompt(chat, messages, use), **_video_options(chat))
    parsed = _parsed(chat, prompt, max_tokens, max_n, _chat_logprobs(chat))
    constraint = with_tool_constraint(parsed.params.constraint, use)
    return attrs.evolve(parsed, params=attrs.evolve(parsed.params, constraint=constraint), tools=use)


def _video_options(chat: schemas.ChatBody) -> dict[str, float | int | None]:
    """``video_fps`` above 0, ``video_max_frames`` at least 2 (frames are sampled in pairs, as
    mlx-vlm samples them) when given; their upper bounds are the server's
    ``mllm.max_request_video_*``, checked by the media loader."""
    fps, max_frames = chat.video_fps, chat.video_max_frames
    if fps is not None and not (math.isfinite(fps) and fps > 0):
        raise bad(f"video_fps must be a number above 0, got {fps!r}.", "video_fps")
    if max_frames is not None and max_frames < 2:
        raise bad(f"video_max_frames must be an integer of at least 2, got {max_frames}.", "video_max_frames")
    return {"video_fps": fps, "video_max_frames": max_frames}


def _completion(completion: schemas.CompletionBody, body: dict, *, max_n: int) -> ParsedRequest:
    prompt = completion.prompt
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt must be a string (or an array holding one string).", "prompt")
    logprobs = completion.logprobs
    if logprobs is not None and not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
        raise bad(f"logprobs must be between 0 and {MAX_COMPLETION_LOGPROBS}, got {logprobs}.", "logprobs")
    return _parsed(completion, prompt, completion.max_tokens, max_n, logprobs)


def _parse(
    body: Any, schema: type, names: frozenset[str], model_names: ServedNames, build: Callable, not_yet: dict[str, tuple]
) -> ParsedRequest:
    """Check field names (``not_yet``: the route's fields accepted only when off) and the model
    (in the body's order), decode, then ``build``."""
    if not isinstance(body, dict):
        raise bad("The request body must be a JSON object.", None)
    for name, value in body.items():
        off = not_yet.get(name) if name in names else None
        if off is not None and not is_off_value(value, off):
            raise bad(f"{name} is not supported by this server yet.", name, "unsupported_parameter")
        if name not in names:
            raise bad(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    model = body.get("model")
    if not isinstance(model, str):
        raise bad("model is required and must be a string.", "model")
    served_as = model_names.resolve(model)
    try:
        decoded = msgspec.convert(body, schema)
    except (msgspec.ValidationError, UnicodeEncodeError):  # the latter: a lone surrogate in a name
        raise _first_error(body, schema, build) from None
    parsed = build(decoded, body)
    params = attrs.evolve(parsed.params, adapter=model_names.adapter(served_as))
    return attrs.evolve(parsed, model=served_as, params=params)


def _first_error(body: dict, schema: type, build: Callable) -> InvalidRequestError:
    """A body with a field of the wrong shape may have other faults: the answer names the one
    met first in :data:`CHECK_ORDER` (shape or value), whatever the order of the body's keys."""
    faults = type_faults(body, schema)
    rest = {name: value for name, value in body.items() if name not in faults}
    try:
        build(msgspec.convert(rest, schema), rest)
    except InvalidRequestError as later:
        if check_position(schema, later.param) < check_position(schema, next(iter(faults))):
            return later
    except (msgspec.ValidationError, UnicodeEncodeError):
        pass  # a fault type_faults did not single out: its safety-net answer below
    return next(iter(faults.values()))


def _chat_logprobs(chat: schemas.ChatBody) -> int | None:
    """Chat's ``logprobs`` (bool) and ``top_logprobs`` (int) as SamplingParams.logprobs."""
    if chat.top_logprobs is not None and not chat.logprobs:
        raise bad("top_logprobs is only allowed when logprobs is true.", "top_logprobs")
    if not chat.logprobs:
        return None
    return 0 if chat.top_logprobs is None else chat.top_logprobs


def _parsed(
    body: schemas._Body,
    prompt: str | ChatPrompt,
    max_tokens: int | None,
    max_n: int,
    logprobs: int | None,
) -> ParsedRequest:
    n = 1 if body.n is None else body.n
    if not 1 <= n <= max_n:
        raise bad(f"n must be between 1 and {max_n}, got {n}.", "n")
    stream = bool(body.stream)
    options = body.stream_options
    if options is not None and options.include_usage is not msgspec.UNSET and not stream:
        raise bad("stream_options is only allowed when stream is true.", "stream_options")
    include_usage = bool(options and options.include_usage)
    params = _sampling(body, max_tokens, logprobs)
    return ParsedRequest(prompt=prompt, params=params, stream=stream, include_usage=include_usage, n=n)


def _sampling(body: schemas._Body, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
    top_k = body.top_k
    fields = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": 0 if top_k == -1 else top_k,  # vLLM's "-1 disables top-k"
        "min_p": body.min_p,
        "seed": body.seed,
        "repetition_penalty": body.repetition_penalty,
        "presence_penalty": body.presence_penalty,
        "frequency_penalty": body.frequency_penalty,
        "min_tokens": body.min_tokens,
        "ignore_eos": body.ignore_eos,
        "stream_interval": body.stream_interval,
        "cache_salt": body.cache_salt,
    }
    stop = body.stop
    return SamplingParams(
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        stop_token_ids=tuple(body.stop_token_ids or ()),
        logit_bias=logit_bias_pairs(body.logit_bias),
        logprobs=logprobs,
        constraint=_constraint(body),
        **{k: v for k, v in fields.items() if v is not None},
    )


def _constraint(body: schemas._Body) -> ConstraintSpec | None:
    """The output constraint of ``response_format`` or one of vLLM's guided-decoding fields;
    more than one is a 400 (which would win is not obvious). ``{"type": "text"}`` is none."""
    found = [(name, spec) for name, spec in _constraint_fields(body) if spec is not None]
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise bad(f"Only one output constraint may be given per request, got {names}.", found[1][0])
    return found[0][1] if found else None


def _constraint_fields(body: schemas._Body) -> list[tuple[str, ConstraintSpec | None]]:
    outputs = body.structured_outputs or schemas.StructuredOutputs()
    return [
        ("response_format", _response_format(body.response_format)),
        ("structured_outputs.json", _json_spec(outputs.json, "structured_outputs.json")),
        ("structured_outputs.regex", _text_spec("regex", outputs.regex)),
        ("structured_outputs.choice", _choice_spec(outputs.choice)),
        ("structured_outputs.grammar", _text_spec("grammar", outputs.grammar)),
        ("guided_json", _json_spec(body.guided_json, "guided_json")),
        ("guided_regex", _text_spec("regex", body.guided_regex)),
        ("guided_choice", _choice_spec(body.guided_choice)),
        ("guided_grammar", _text_spec("grammar", body.guided_grammar)),
    ]


def _response_format(response_format: schemas.ResponseFormat | None) -> ConstraintSpec | None:
    """``json_object`` and ``json_schema`` constrain; ``strict`` is accepted, and every schema
    is enforced strictly. A ``json_schema`` without a schema is any JSON object."""
    if isinstance(response_format, schemas.JsonObjectFormat):
        return ConstraintSpec(kind="json_object", body="")
    if isinstance(response_format, schemas.JsonSchemaFormat):
        schema = response_format.json_schema.schema
        if schema is None:
            return ConstraintSpec(kind="json_object", body="")
        return ConstraintSpec(kind="json_schema", body=canonical_json(schema))
    return None


def _json_spec(schema: dict[str, Any] | str | None, param: str) -> ConstraintSpec | None:
    if schema is None:
        return None
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise bad(f"{param} must be a JSON schema (an object, or a string holding one): {exc}", param) from exc
    if not isinstance(schema, dict):
        raise bad(f"{param} must be a JSON schema object.", param)
    return ConstraintSpec(kind="json_schema", body=canonical_json(schema))


def _text_spec(kind: str, text: str | None) -> ConstraintSpec | None:
    return None if text is None else ConstraintSpec(kind=kind, body=text)  # type: ignore[arg-type]


def _choice_spec(choices: list[str] | None) -> ConstraintSpec | None:
    return None if choices is None else ConstraintSpec(kind="choice", body=json.dumps(choices, ensure_ascii=False))


def _message(message: schemas.MessageIn, raw: dict, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if message.role not in schemas.ROLES:
        roles = ", ".join(schemas.ROLES)
        raise bad(f"{where}.role must be one of {roles}, got {message.role!r:.50}.", f"{where}.role")
    content = message.content
    parts: tuple[ContentPart, ...] | None = None
    if isinstance(content, str):
        parts = (TextPart(text=content),)
    elif content is not None:
        parts = tuple(_part(part, raw["content"][j], f"{where}.content[{j}]") for j, part in enumerate(content))
    for key, value in raw.items():  # in the body's order
        off = schemas.MESSAGE_OFF.get(key)
        if off is not None and not is_off_value(value, off):
            raise bad(f"{where}.{key} is not supported by this server yet.", f"{where}.{key}", "unsupported_parameter")
    return tool_message(message, parts, where)


def _part(part: schemas.ContentPartIn, raw: dict, where: str) -> ContentPart:
    """A content part as the engine carries it: text, or media by reference and hash."""
    if isinstance(part, schemas.TextPartIn):
        return TextPart(text=part.text)
    if isinstance(part, schemas.ImagePartIn):
        url = part.image_url.url
        return ImagePart(ref=url, content_hash=_content_hash(url), detail=part.image_url.detail)
    if isinstance(part, schemas.VideoPartIn):
        return VideoPart(ref=part.video_url.url, content_hash=_content_hash(part.video_url.url))
    if isinstance(part, schemas.VideoPartAlt):
        return VideoPart(ref=part.video, content_hash=_content_hash(part.video))
    raise part_error(raw, where)  # input_audio: no runner takes audio yet


def _content_hash(ref: str) -> str:
    """The prefix-cache key of a media reference: a hash of the reference as sent (a data URL
    holds the bytes themselves; a runner that fetches a remote URL keys it by that URL)."""
    return hashlib.sha256(ref.encode("utf-8", "surrogatepass")).hexdigest()
