"""A tool call whose arguments stream as the model writes them (every family).

Once a call's markup shows its name and the start of its arguments, the call opens (a delta with
its index, id and name) and its arguments go out as fragments as they arrive: a JSON object's text
exactly as the model wrote it (:class:`JsonArguments`), or key/value tags as JSON members
(``pair_arguments``); the fragments concatenate to the call's final ``arguments``. When the call's
markup ends, the whole of it is read again by the format to check it; calls after the first in the
same markup (llama3_json's ``;``-separated ones) are sent whole then.

If it does not check out (the arguments are cut off or are not JSON, or text after them is not
the call's markup), the call is kept with the arguments already sent (as vLLM does: a client
holds them already), and a WARNING logs the markup, including any text that was not sent.
"""

from __future__ import annotations

import json
import logging
import re

import attrs

from .types import MarkupError, RawCall

logger = logging.getLogger(__name__)

#: The markup of a call up to the ``{`` that opens its arguments object: name first, then the arguments.
CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\{\s*["}])')
_DECODER = json.JSONDecoder()
#: Characters JSON has outside its strings (the letters of true/false/null and exponents included).
_JSON_OUTSIDE_STRINGS = frozenset("{}[],:.+-0123456789 \t\r\neEtrufalsn")


@attrs.frozen(kw_only=True)
class CallHead:
    """The markup before a call's arguments: the call's name, its length, the id it gives, the marker that
    ends the call inside its region (None: the region's end), and how its arguments are read (None: JSON)."""

    name: str
    length: int
    call_id: str | None = None
    end: str | None = None
    reader: object = None


def match_call_head(text: str) -> tuple[str, int] | None:
    """(name, length of the head) when ``text`` starts with a call's head, else None."""
    head = CALL_HEAD.match(text)
    if head is None:
        return None
    try:
        name = json.loads(head.group(1))
    except ValueError:
        return None
    return (name, head.end()) if name else None


def json_run_end(text: str, skipped: tuple[str, ...] = ()) -> int:
    """Where text that is not JSON starts in ``text``: past whole JSON values, whitespace, ``;`` and ``,``
    separators, the rest of an object or array begun before ``text`` (its closing brackets, and its
    members: a string or number is taken after ``,`` or ``:`` only), and the ``skipped`` markers."""
    pos, after = 0, ""
    while pos < len(text):
        ch = text[pos]
        if ch in " \t\r\n":
            pos += 1
            continue
        if ch in ";,:}]":
            pos, after = pos + 1, ch
            continue
        marker = next((m for m in skipped if text.startswith(m, pos)), None)
        if marker:
            pos, after = pos + len(marker), ""
            continue
        if not (ch in "{[" or (after in (",", ":") and ch in '"-0123456789tfn')):
            return pos
        try:
            pos, after = _DECODER.raw_decode(text, pos)[1], "value"
        except json.JSONDecodeError:
            return pos
    return pos


class ObjectScanner:
    """Finds where a JSON object ends in text arriving piece by piece (strings, escapes, nesting)."""

    def __init__(self) -> None:
        self._depth = 0
        self._in_string = False
        self._escaped = False
        #: The object closed.
        self.done = False
        #: A character that JSON cannot have here came: the object is broken, nothing more is taken.
        self.stopped = False

    def take(self, text: str) -> int:
        """How many characters of ``text`` belong to the object (all, unless it ends or breaks)."""
        for at, ch in enumerate(text):
            if self.done or self.stopped:
                return at
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif ch == "\\":
                    self._escaped = True
                elif ch == '"':
                    self._in_string = False
                continue
            if ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                self.done = self._depth == 0
            elif ch not in _JSON_OUTSIDE_STRINGS:
                self.stopped = True
                return at
        return len(text)


class JsonArguments:
    """Arguments written as a JSON object: its text is sent as it comes, exactly as written."""

    def __init__(self) -> None:
        self.scanner = ObjectScanner()

    @property
    def done(self) -> bool:
        return self.scanner.done

    def take(self, text: str, *, final: bool = False) -> tuple[str, int]:
        """(fragment to send, characters of ``text`` read): the part of ``text`` that is the object."""
        used = self.scanner.take(text)
        return text[:used], used

    def close(self) -> str:
        return ""


class StreamedCall:
    """One call being streamed: its head, the markup read as arguments, the fragments sent, the markup after."""

    def __init__(
        self, *, index: int, name: str, head: str, reader: JsonArguments | None = None, end: str | None = None
    ):
        self.index = index
        self.name = name
        self.head = head
        #: Reads the arguments' markup into fragments (JSON as written, or a format's key/value tags).
        self.reader = reader or JsonArguments()
        #: The marker that ends this call inside its region (None: the region's end).
        self.end = end
        self.raw = ""
        self.arguments = ""
        self.tail = ""

    def take_arguments(self, text: str, *, final: bool = False) -> tuple[str, int]:
        """(fragment to send now, characters of ``text`` read); the caller keeps the rest of ``text``."""
        fragment, used = self.reader.take(text, final=final)
        self.raw += text[:used]
        self.arguments += fragment
        return fragment, used

    def close_arguments(self) -> str:
        """The last fragment (the ``}`` of arguments built from tags), at the end of the call's markup."""
        fragment = self.reader.close()
        self.arguments += fragment
        return fragment

    @property
    def markup(self) -> str:
        return self.head + self.raw + self.tail

    def check(self, calls: list[RawCall] | MarkupError, fmt_name: str) -> list[RawCall]:
        """At the end of the markup: the calls after this one in it (llama3_json's ``;``-separated calls), to
        send whole; a WARNING (and none) unless it reads as this call with these arguments first."""
        problem = self._problem(calls)
        if problem is not None:
            logger.warning(
                "%s tool parser: call %r kept with the %d characters of arguments already streamed (%s); "
                "markup: %.300r; not sent: %.200r",
                fmt_name,
                self.name,
                len(self.arguments),
                problem,
                self.markup,
                self.tail,
            )
            return []
        assert not isinstance(calls, MarkupError)
        return calls[1:]

    def _problem(self, calls: list[RawCall] | MarkupError) -> str | None:
        if isinstance(calls, MarkupError):
            return str(calls)
        if not calls or calls[0].name != self.name:
            return "the markup does not start with this call"
        try:
            streamed = json.loads(self.arguments)
        except ValueError as exc:
            return f"the arguments are not JSON: {exc}"
        return None if streamed == calls[0].arguments else "the markup gives other arguments"
