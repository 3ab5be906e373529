"""Arguments written as key/value tags, streamed as JSON members (``qwen3_coder``, ``glm45``).

Each pair goes out as a member of the JSON object, typed by the tool's schema: ``{"city": "Paris"``,
then ``, "days": 3``, and ``}`` when the call's markup ends. A value the schema makes a plain string
streams as it is written (``{"content": "first li``, ``nes of the file``, ..., ``"``); any other value
goes out once its closing tag is seen. The fragments make exactly the text ``json.dumps`` writes of the
same arguments, so they concatenate to the call's final ``arguments``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import attrs

from .text import partial_marker_len


@attrs.frozen(kw_only=True)
class PairTags:
    """One family's key/value tags."""

    #: A whole pair, its closing tag seen (groups: key, raw value).
    pair: re.Pattern
    #: A last pair cut by the end of the call's markup (groups: key, raw value).
    last_pair: re.Pattern
    #: The tags up to where a value starts (group: key).
    opening: re.Pattern
    #: The value's closing tag, consumed with it.
    closing: str
    #: Markers that end a value without being part of it (the next pair's opening tag).
    ends_before: tuple[str, ...] = ()
    #: One newline on each side of a value belongs to the tags (Qwen3-Coder), not the value.
    newlines_are_tags: bool = False


def _member(first: bool, key: str) -> str:
    return ("{" if first else ", ") + json.dumps(key, ensure_ascii=False) + ": "


class PairArguments:
    """Reads one call's key/value tags as they arrive (see the module's docstring)."""

    #: Arguments built from tags are never "done" before their call's markup ends.
    done = False

    def __init__(
        self, tags: PairTags, value: Callable[[str, str], tuple[str, Any]], streams: Callable[[str], bool]
    ) -> None:
        """``value`` gives (key, typed value) of a raw pair; ``streams`` says a key's value is a plain string."""
        self._tags = tags
        self._value = value
        self._streams = streams
        self._sent = False
        #: Inside a streamed string value: its first character not seen yet / a held newline.
        self._open = False
        self._at_value_start = False
        self._held_newline = False

    def take(self, text: str, *, final: bool = False) -> tuple[str, int]:
        """(fragment to send, characters of ``text`` read); with ``final`` (the call's markup ended) a
        last pair or value without its closing tag is read too."""
        pos, parts = 0, []
        while True:
            if self._open:
                pos = self._take_string(text, pos, parts, final=final)
                if self._open:
                    return "".join(parts), pos
                continue
            match = self._tags.pair.match(text, pos) or (self._tags.last_pair.match(text, pos) if final else None)
            opening = self._tags.opening.match(text, pos)
            if opening is not None and self._streams(opening.group(1).strip()):
                parts.append(_member(not self._sent, opening.group(1).strip()) + '"')
                self._sent = self._open = self._at_value_start = True
                pos = opening.end()
                continue
            if match is None or match.end() == pos:
                return "".join(parts), pos
            key, value = self._value(match.group(1), match.group(2))
            parts.append(_member(not self._sent, key) + json.dumps(value, ensure_ascii=False))
            self._sent = True
            pos = match.end()

    def _take_string(self, text: str, pos: int, parts: list[str], *, final: bool) -> int:
        """Send the string value's text from ``pos``; at its end close it. Returns where reading stopped."""
        tags = self._tags
        ends = (tags.closing, *tags.ends_before)
        found = [(at, marker) for marker in ends if (at := text.find(marker, pos)) >= 0]
        end_at, marker = min(found) if found else (len(text) if final else -1, "")
        stop = end_at if end_at >= 0 else len(text) - partial_marker_len(text[pos:], ends)
        parts.append(self._string_piece(text[pos:stop], last=end_at >= 0))
        if end_at < 0:
            return stop
        parts.append('"')
        self._open = False
        return end_at + len(marker) if marker == tags.closing else end_at

    def _string_piece(self, raw: str, *, last: bool) -> str:
        """``raw`` as JSON string text; a newline at the value's start or end is the tags' (Qwen3-Coder)."""
        if self._tags.newlines_are_tags:
            if self._at_value_start and raw:
                raw = raw[1:] if raw.startswith("\n") else raw
                self._at_value_start = False
            raw = ("\n" if self._held_newline else "") + raw
            self._held_newline = raw.endswith("\n")
            raw = raw[:-1] if self._held_newline else raw
            if last:
                self._held_newline = False
        return json.dumps(raw, ensure_ascii=False)[1:-1]

    def close(self) -> str:
        return "}" if self._sent else "{}"
