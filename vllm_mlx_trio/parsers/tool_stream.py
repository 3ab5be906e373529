"""The streaming state machine of the tool parsers (every family but harmony).

Content streams until a format's start marker; only a suffix that could be the start of one is
held back. Markup is buffered until its end marker (or the end of the text), then read into
whole calls by the format. Each call goes out as one delta with its index, id, name and the
whole arguments JSON. Markup that does not parse goes back into the content with a WARNING.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

from .text import MarkupTrimmer, find_first, partial_marker_len
from .types import MarkupError, ParsedDelta, RawCall, new_call_id

logger = logging.getLogger(__name__)


class ToolFormat:
    """One family's markup. Subclasses set ``name`` and ``regions`` and read a region's text."""

    name: ClassVar[str]
    #: (start marker, end marker) of each kind of markup region; end None: to the end of the text.
    regions: ClassVar[tuple[tuple[str, str | None], ...]]
    #: Text the parser detects in a chat template (see detect.py).
    template_markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: Sequence[dict] | None = None) -> None:
        self.tools = {
            tool["function"]["name"]: tool["function"]
            for tool in tools or ()
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "name" in tool["function"]
        }

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        """The calls in one region (``body`` is between the markers); raises MarkupError."""
        raise NotImplementedError

    def bare_call_start(self, text: str) -> bool | None:
        """At the start of the content: does ``text`` open an unmarked call (True), not (False), unsure (None)?"""
        return False

    def new_id(self) -> str:
        return new_call_id()


class ToolStream:
    """Feeds content text through one :class:`ToolFormat` (or none: content passes through)."""

    def __init__(self, fmt: ToolFormat | None) -> None:
        self._fmt = fmt
        self._starts = tuple(start for start, _ in fmt.regions) if fmt else ()
        self._pending = ""
        self._region: tuple[str, str | None] | None = None
        self._at_start = fmt is not None
        self._trimmer = MarkupTrimmer()
        self._next_index = 0

    def feed(self, text: str) -> list[ParsedDelta]:
        self._pending += text
        out: list[ParsedDelta] = []
        while self._pending:
            before = (self._region, len(self._pending), self._at_start)
            if self._at_start:
                self._step_start()
            elif self._region is None:
                self._step_content(out)
            else:
                self._step_region(out)
            if (self._region, len(self._pending), self._at_start) == before:
                break
        return [d for d in out if d != ParsedDelta()]

    def finish(self) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        rest, self._pending = self._pending, ""
        if self._region is not None:
            start, _ = self._region
            self._close_region(start, rest, rest, out, quiet=start == "")
        elif self._at_start and self._fmt is not None and self._fmt.bare_call_start(rest):
            self._close_region("", rest, rest, out, quiet=True)
        else:
            out.append(ParsedDelta(content=self._trimmer.push(rest)))
        out.append(ParsedDelta(content=self._trimmer.flush()))
        return [d for d in out if d != ParsedDelta()]

    def _step_start(self) -> None:
        assert self._fmt is not None
        verdict = self._fmt.bare_call_start(self._pending)
        if verdict is None:
            return
        self._at_start = False
        if verdict:
            self._region = ("", None)

    def _step_content(self, out: list[ParsedDelta]) -> None:
        found = find_first(self._pending, self._starts)
        if found is None:
            keep = partial_marker_len(self._pending, self._starts)
            cut = len(self._pending) - keep
            out.append(ParsedDelta(content=self._trimmer.push(self._pending[:cut])))
            self._pending = self._pending[cut:]
            return
        at, start = found
        out.append(ParsedDelta(content=self._trimmer.push(self._pending[:at])))
        self._pending = self._pending[at + len(start) :]
        assert self._fmt is not None
        self._region = next(region for region in self._fmt.regions if region[0] == start)

    def _step_region(self, out: list[ParsedDelta]) -> None:
        assert self._region is not None
        start, end = self._region
        if end is None:
            return
        at = self._pending.find(end)
        if at < 0:
            return
        body = self._pending[:at]
        self._pending = self._pending[at + len(end) :]
        self._close_region(start, body, start + body + end, out, quiet=start == "")

    def _close_region(self, start: str, body: str, raw: str, out: list[ParsedDelta], *, quiet: bool = False) -> None:
        """A whole region: its calls as deltas, or its raw text as content if it does not parse."""
        assert self._fmt is not None
        self._region = None
        try:
            calls = self._fmt.parse_region(start, body)
            if not calls:
                raise MarkupError("no call in the markup")
        except MarkupError as exc:
            if not quiet:
                logger.warning("%s tool parser: markup returned as content (%s): %.200r", self._fmt.name, exc, raw)
            out.append(ParsedDelta(content=self._trimmer.push(start + body if raw is body else raw)))
            return
        self._trimmer.markup()
        for call in calls:
            out.append(
                ParsedDelta(
                    tool_index=self._next_index,
                    tool_id=call.id or self._fmt.new_id(),
                    tool_name=call.name,
                    arguments=call.arguments_json(),
                )
            )
            self._next_index += 1
