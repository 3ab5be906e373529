"""The parsed pieces of an assistant message: whole tool calls, streamed deltas, the whole message."""

from __future__ import annotations

import json
import secrets
import string

import attrs

#: Alphabet of generated call ids (OpenAI's ids are ``call_`` + alphanumerics).
_ID_ALPHABET = string.ascii_letters + string.digits
#: Length of the random part of a generated call id (as OpenAI's own ids).
CALL_ID_RANDOM_CHARS = 24


def new_call_id(random_chars: int = CALL_ID_RANDOM_CHARS, *, prefix: str = "call_") -> str:
    """A fresh tool-call id: ``call_`` + 24 random alphanumerics."""
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(random_chars))


@attrs.frozen
class ToolCall:
    """A whole tool call: ``arguments`` is the JSON text of an object."""

    id: str
    name: str
    arguments: str


@attrs.frozen
class ParsedDelta:
    """One piece of a streamed assistant message; fields not set are empty/None."""

    content: str = ""
    reasoning: str = ""
    #: Set for a tool-call piece: 0, 1, ... in order of the calls.
    tool_index: int | None = None
    #: Set on a call's first piece only.
    tool_id: str | None = None
    #: Set on a call's first piece only.
    tool_name: str | None = None
    #: A fragment; a call's fragments concatenate to its exact final JSON.
    arguments: str = ""


@attrs.frozen
class ParsedMessage:
    """The whole assistant message: what the streamed deltas add up to."""

    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]


@attrs.frozen
class RawCall:
    """A call as one tool format read it from the markup, before it gets its index."""

    name: str
    #: The arguments object, already decoded.
    arguments: dict
    #: The id the model gave (Kimi K2, Mistral's ``[CALL_ID]``), else None.
    id: str | None = None

    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


class MarkupError(ValueError):
    """Tool-call markup that does not parse: it goes back into the content with a WARNING."""


def assemble_message(deltas: list[ParsedDelta]) -> ParsedMessage:
    """The whole message the deltas add up to (empty text becomes None)."""
    content = "".join(d.content for d in deltas)
    reasoning = "".join(d.reasoning for d in deltas)
    calls: dict[int, list[str]] = {}
    for delta in deltas:
        if delta.tool_index is None:
            continue
        if delta.tool_index not in calls:
            calls[delta.tool_index] = [delta.tool_id or "", delta.tool_name or "", ""]
        calls[delta.tool_index][2] += delta.arguments
    tool_calls = tuple(ToolCall(id=i, name=n, arguments=a) for _, (i, n, a) in sorted(calls.items()))
    return ParsedMessage(content=content or None, reasoning=reasoning or None, tool_calls=tool_calls)
