"""Tool formats whose calls are JSON: ``hermes`` (Qwen 2.5/3, Hermes), ``llama3_json``, ``mistral``."""

from __future__ import annotations

import json
import re
from typing import Any

from .streamed_call import CallHead, json_run_end, match_call_head
from .tool_stream import ToolFormat
from .types import MarkupError, RawCall

_DECODER = json.JSONDecoder()


def decode_arguments(value: Any) -> dict:
    """A call's arguments as an object: given as one, or as a JSON string of one."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except json.JSONDecodeError as exc:
            raise MarkupError(f"arguments are not JSON: {exc}") from exc
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MarkupError("arguments are not a JSON object")
    return value


def call_from_object(
    obj: Any, *, args_keys: tuple[str, ...] = ("arguments", "parameters"), args_required: bool = False
) -> RawCall:
    """``{"name": ..., "arguments": {...}}`` (or ``parameters``) as a call (without them: no arguments,
    unless ``args_required``)."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise MarkupError("not a {'name': ..., 'arguments': ...} object")
    if args_required and not any(key in obj for key in args_keys):
        raise MarkupError("no arguments in the object")
    args = next((obj[key] for key in args_keys if key in obj), {})
    call_id = obj.get("id") if isinstance(obj.get("id"), str) and obj.get("id") else None
    return RawCall(name=obj["name"], arguments=decode_arguments(args), id=call_id)


def decode_json_values(text: str, *, separators: str = "") -> list[Any]:
    """Every JSON value in ``text``, one after another, apart by whitespace or ``separators``."""
    values = []
    pos = 0
    skip = " \t\r\n" + separators
    while True:
        while pos < len(text) and text[pos] in skip:
            pos += 1
        if pos >= len(text):
            return values
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise MarkupError(f"not JSON: {exc.msg} at {exc.pos}") from exc
        values.append(value)


class HermesFormat(ToolFormat):
    """``<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>``, one block per call."""

    name = "hermes"
    regions = (("<tool_call>", "</tool_call>"),)
    markup = ("<tool_call>", "</tool_call>")
    streams_arguments = True

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        values = decode_json_values(body)
        if len(values) != 1:
            raise MarkupError(f"{len(values)} JSON values in one <tool_call>")
        return [call_from_object(values[0])]


class Llama3JsonFormat(ToolFormat):
    """Llama 3.x: ``<|python_tag|>{"name": "f", "parameters": {...}}`` or the same JSON bare as the whole reply.

    Several calls are separated by ``;``: the first one's arguments stream, the others are sent whole
    at the end. A reply that starts with ``{`` and is not a call's head is held until it ends, then
    read as calls; if it is not one, it is the content (no warning: a JSON answer).
    """

    name = "llama3_json"
    regions = (("<|python_tag|>", None),)
    markup = ("<|python_tag|>",)
    streams_arguments = True
    end_tokens = ("<|eom_id|>", "<|eot_id|>")

    def bare_call_start(self, text: str) -> bool | None:
        stripped = text.lstrip()
        if not stripped:
            return None
        return stripped.startswith("{")

    def trailing_text_at(self, body: str) -> int:
        return json_run_end(body, (*self.markup, *self.end_tokens))

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        """The calls, ``;``-separated or each after its own ``<|python_tag|>``; a bare reply's object
        must give its arguments (``{"name": "x"}`` alone is an answer, not a call)."""
        for marker in (*self.markup, *self.end_tokens):
            body = body.replace(marker, ";")
        values = decode_json_values(body, separators=";")
        return [call_from_object(value, args_required=not start) for value in values]


#: A v11+ call's head up to its arguments object: ``name[ARGS]`` or ``name[CALL_ID]id[ARGS]``.
_V11_HEAD = re.compile(r"\s*(?P<name>[\w.\-]+)(?:\[CALL_ID\](?P<id>[^\[]*))?\[ARGS\]\s*(?=\{)")
#: The ``[`` of an older Mistral reply's array of call objects.
_ARRAY_OPEN = re.compile(r"\s*\[")


class MistralFormat(ToolFormat):
    """``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (older) or ``[TOOL_CALLS]name[ARGS]{...}``
    repeated per call (tokenizer v11+), optionally ``name[CALL_ID]id[ARGS]{...}``.

    Ids: Mistral's templates take the last 9 characters of an id, so ``call_`` + 24 works.
    """

    name = "mistral"
    regions = (("[TOOL_CALLS]", None),)
    markup = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    streams_arguments = True

    def call_head(self, start: str, text: str) -> CallHead | None:
        """``name[ARGS]`` / ``name[CALL_ID]id[ARGS]`` (v11+), or ``[{"name": ..., "arguments": `` (older)."""
        v11 = _V11_HEAD.match(text)
        if v11 is not None:
            return CallHead(name=v11["name"], length=v11.end(), call_id=(v11["id"] or "").strip() or None)
        bracket = _ARRAY_OPEN.match(text)
        if bracket is None:
            return None
        head = match_call_head(text[bracket.end() :])
        return None if head is None else CallHead(name=head[0], length=bracket.end() + head[1])

    def trailing_text_at(self, body: str) -> int:
        """After the last call's JSON (an array, or the object after ``name[ARGS]`` / ``name``)."""
        marker = self.regions[0][0]
        offset = body.rfind(marker) + len(marker) if marker in body else 0
        part = body[offset:]
        args = part.find("[ARGS]")
        if args >= 0:
            json_at = args + len("[ARGS]")
        else:
            starts = [at for at in (part.find("{"), part.find("[")) if at >= 0]
            if not starts:
                return len(body)
            json_at = min(starts)
        return offset + json_at + json_run_end(part[json_at:])

    def ready_call(self, region_text: str) -> int | None:
        """A call is whole once the next ``[TOOL_CALLS]`` starts."""
        following = region_text.find(self.regions[0][0], 1)
        return following if following > 0 else None

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        calls: list[RawCall] = []
        for part in body.split(start):
            part = part.strip()
            if part:
                calls.extend(self._parse_part(part))
        return calls

    def _parse_part(self, part: str) -> list[RawCall]:
        if part[0] in "[{":
            values = decode_json_values(part)
            objects = [obj for value in values for obj in (value if isinstance(value, list) else [value])]
            return [call_from_object(obj) for obj in objects]
        if "[ARGS]" in part:
            head, args = part.split("[ARGS]", 1)
        elif "{" in part:
            head, args = part[: part.index("{")], part[part.index("{") :]
        else:
            raise MarkupError("no arguments after the tool name")
        name, _, call_id = head.partition("[CALL_ID]")
        name = name.strip()
        if not re.fullmatch(r"[\w.\-]+", name):
            raise MarkupError(f"bad tool name {name!r}")
        values = decode_json_values(args)
        if len(values) != 1:
            raise MarkupError("expected one arguments object")
        return [RawCall(name=name, arguments=decode_arguments(values[0]), id=call_id.strip() or None)]
