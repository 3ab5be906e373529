"""The streaming state machine of the tool parsers (every family but harmony).

Content streams until a format's start marker; only a suffix that could be the start of one is
held back. Markup is buffered until its end marker (or the end of the text), then read into
whole calls by the format; each such call goes out as one delta with its index, id, name and the
whole arguments JSON. Markup that does not parse goes back into the content with a WARNING.
A format with ``streams_arguments`` (all of them) instead opens a call as soon as its name and the
start of its arguments are seen (:meth:`ToolFormat.call_head`), and streams its arguments (see
``streamed_call``); a call it cannot open so (arguments given as a JSON string, a Kimi id that does
not name the tool) is read whole when its markup ends.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import ClassVar

from .streamed_call import CallHead, StreamedCall, json_run_end, match_call_head
from .text import MarkupTrimmer, find_first, partial_marker_len
from .types import MarkupError, ParsedDelta, RawCall, new_call_id

logger = logging.getLogger(__name__)


class ToolFormat:
    """One family's markup. Subclasses set ``name`` and ``regions`` and read a region's text."""

    name: ClassVar[str]
    #: (start marker, end marker) of each kind of markup region; end None: to the end of the text.
    regions: ClassVar[tuple[tuple[str, str | None], ...]]
    #: Every markup string of the family (many are special tokens the detokenizer must keep).
    markup: ClassVar[tuple[str, ...]] = ()
    #: A region holds one ``{"name": ..., "arguments": {...}}`` object whose arguments can stream as they come.
    streams_arguments: ClassVar[bool] = False
    #: Markup the model may write inside its thinking block without closing it first: it ends the
    #: reasoning there (Kimi-K2-Thinking's tool-call section).
    reasoning_ends: ClassVar[tuple[str, ...]] = ()
    #: Tokens that may close the output after the calls (Llama's ``<|eom_id|>``): neither calls nor content.
    end_tokens: ClassVar[tuple[str, ...]] = ()
    #: By a region's start marker: an end marker the model may still write after that region closes
    #: (Qwen3-Coder's ``<function=...>...</function></tool_call>`` without its ``<tool_call>``); dropped.
    orphan_ends: ClassVar[dict[str, str]] = {}

    def __init__(self, tools: Sequence[dict] | None = None) -> None:
        self.tools = {
            tool["function"]["name"]: tool["function"]
            for tool in tools or ()
            if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and "name" in tool["function"]
        }

    def parse_region(self, start: str, body: str) -> list[RawCall]:
        """The calls in one region (``body`` is between the markers); raises MarkupError."""
        raise NotImplementedError

    def call_head(self, start: str, text: str) -> CallHead | None:
        """With ``streams_arguments``: the call whose arguments start in the text of an open region (opened
        by ``start``); the head ends where the arguments begin."""
        head = match_call_head(text)
        return None if head is None else CallHead(name=head[0], length=head[1])

    def ready_call(self, region_text: str) -> int | None:
        """Length of a whole call at the start of an open region's text, to send before the region ends."""
        return None

    def trailing_text_at(self, body: str) -> int:
        """In a region without an end marker, closed by the end of the output: where the text after its
        calls starts (that text is content)."""
        return len(body)

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
        self._region_read = False
        self._region_parsed = False
        self._openers = frozenset(start[0] for start in self._starts)
        self._scan_from = 0
        self._call: StreamedCall | None = None
        #: An orphan end marker that may come next (see ``ToolFormat.orphan_ends``).
        self._orphan: str | None = None

    def feed(self, text: str) -> list[ParsedDelta]:
        idle = self._region is None and not self._at_start and not self._pending and self._orphan is None
        if idle and not self._may_open(text):
            content = self._trimmer.push(text)  # fast path: no markup can start in it
            return [ParsedDelta(content=content)] if content else []
        if self._region is not None:
            # Where the end marker may start: it was not in the text held already.
            self._scan_from = max(0, len(self._pending) - len(self._region[1] or "") + 1)
        self._pending += text
        out: list[ParsedDelta] = []
        while self._pending:
            before = (self._region, len(self._pending), self._at_start, self._orphan)
            if self._at_start:
                self._step_start()
            elif self._region is None and self._orphan is not None:
                self._step_orphan()
            elif self._region is None:
                self._step_content(out)
            else:
                self._step_region(out)
            if (self._region, len(self._pending), self._at_start, self._orphan) == before:
                break
        return [d for d in out if d != ParsedDelta()]

    def _may_open(self, text: str) -> bool:
        return any(ch in text for ch in self._openers)

    def finish(self) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        rest, self._pending = self._pending, ""
        if self._region is not None:
            self._close_region(self._region[0], rest, "", out)
        elif self._at_start and self._fmt is not None and self._fmt.bare_call_start(rest):
            self._region = ("", None)
            self._close_region("", rest, "", out)
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

    def _step_orphan(self) -> None:
        """Drop the orphan end marker if it comes next (whitespace before it is markup's); wait while it may."""
        assert self._orphan is not None
        rest = self._pending.lstrip()
        if rest.startswith(self._orphan):
            self._pending, self._orphan = rest[len(self._orphan) :], None
        elif not self._orphan.startswith(rest):
            self._orphan = None

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
        assert self._region is not None and self._fmt is not None
        start, end = self._region
        end_at = self._pending.find(end, self._scan_from) if end else -1
        self._scan_from = 0
        if self._fmt.streams_arguments and (self._call is not None or self._open_call(end_at, out)):
            self._step_streamed_call(out)
            return
        ready = self._fmt.ready_call(self._pending)
        if ready is not None and (end_at < 0 or ready <= end_at):
            piece, self._pending = self._pending[:ready], self._pending[ready:]
            self._read_markup(start, piece, "", out, last=False)
            return
        if end is None or end_at < 0:
            return
        body = self._pending[:end_at]
        self._pending = self._pending[end_at + len(end) :]
        self._close_region(start, body, end, out)

    def _close_region(self, start: str, body: str, end: str, out: list[ParsedDelta]) -> None:
        """The end of a region: the rest of its text (``end``: its end marker, "" at the end of the output).

        A region without an end marker runs to the end of the output: text after its calls is content.
        """
        assert self._region is not None and self._fmt is not None
        trailing = ""
        if self._region[1] is None:
            if self._call is not None:  # the rest of a streamed call's markup
                cut = json_run_end(body, (*self._fmt.markup, *self._fmt.end_tokens))
            else:
                cut = self._fmt.trailing_text_at(body)
            if body[:cut].strip() or self._call is not None:  # else: no calls to split the text from
                body, trailing = body[:cut], body[cut:]
        self._region = None
        if self._call is not None:
            self._close_streamed_call(start, body, "", out)
            self._region_read = False
            self._orphan = self._fmt.orphan_ends.get(start)
        else:
            self._read_markup(start, body, end, out, last=True)
        if trailing:
            out.append(ParsedDelta(content=self._trimmer.push(trailing)))

    def _open_call(self, end_at: int, out: list[ParsedDelta]) -> bool:
        """Open a streamed call if the region (up to its end marker, if seen) starts with a call's head."""
        assert self._fmt is not None and self._region is not None
        head = self._fmt.call_head(self._region[0], self._pending if end_at < 0 else self._pending[:end_at])
        if head is None:
            return False
        self._call = StreamedCall(
            index=self._next_index, name=head.name, head=self._pending[: head.length], reader=head.reader, end=head.end
        )
        self._next_index += 1
        self._pending = self._pending[head.length :]
        self._trimmer.markup()
        call_id = head.call_id or self._fmt.new_id()
        out.append(ParsedDelta(tool_index=self._call.index, tool_id=call_id, tool_name=head.name))
        return True

    def _step_streamed_call(self, out: list[ParsedDelta]) -> None:
        """Send the arguments seen so far; at the call's end marker (or its region's), close the call."""
        assert self._call is not None and self._region is not None
        start, end = self._region
        ends = tuple(marker for marker in (self._call.end, end) if marker)
        found = find_first(self._pending, ends)
        # a suffix that may be the start of an end marker waits
        limit = found[0] if found else len(self._pending) - partial_marker_len(self._pending, ends)
        self._pending = self._pending[self._send_arguments(self._pending[:limit], out) :]
        if self._call.end is None and self._next_region_starts():  # the next call's own start, no end between
            self._close_region(start, "", "", out)
            return
        found = find_first(self._pending, ends)
        if found is None:
            return
        at, marker = found
        body, self._pending = self._pending[:at], self._pending[at + len(marker) :]
        if marker == end:
            self._close_region(start, body, end, out)
            return
        self._close_streamed_call(start, body, marker, out)  # the region goes on: more calls may follow
        self._region_read = self._region_parsed = True

    def _send_arguments(self, text: str, out: list[ParsedDelta], *, final: bool = False) -> int:
        """Read ``text`` (of the open call's markup) as arguments and send what it gives; how much was read."""
        assert self._call is not None
        fragment, used = self._call.take_arguments(text, final=final)
        if fragment:
            out.append(ParsedDelta(tool_index=self._call.index, arguments=fragment))
        return used

    def _next_region_starts(self) -> bool:
        """The call's arguments are whole and another region starts (Mistral's next ``[TOOL_CALLS]``, which
        has no end marker; a Kimi or DeepSeek call whose end marker the model left out)."""
        assert self._call is not None
        rest = self._pending.lstrip()
        return self._call.reader.done and rest.startswith(self._starts)

    def _close_streamed_call(self, start: str, rest: str, end: str, out: list[ParsedDelta]) -> None:
        """The end of a streamed call's markup (``rest``: its text not read yet; ``end``: the call's end marker
        if it has its own): send the last of its arguments, then check the whole markup (a WARNING if it does
        not read as the call sent)."""
        assert self._call is not None and self._fmt is not None
        call = self._call
        call.tail = rest[self._send_arguments(rest, out, final=True) :] + end
        self._call = None
        closing = call.close_arguments()
        if closing:
            out.append(ParsedDelta(tool_index=call.index, arguments=closing))
        try:
            calls: list[RawCall] | MarkupError = self._fmt.parse_region(start, call.markup)
        except MarkupError as exc:
            calls = exc
        out.extend(self._call_deltas(call.check(calls, self._fmt.name)))

    def _read_markup(self, start: str, body: str, end: str, out: list[ParsedDelta], *, last: bool) -> None:
        """Markup text as calls, or as content as written if it does not parse (with a WARNING).

        A region may be read in pieces (a section of several calls, each sent once complete):
        ``_region_read`` says a piece of this region was read already, ``_region_parsed`` that one gave calls.
        """
        assert self._fmt is not None
        continued, self._region_read = self._region_read, not last
        if not continued:
            self._region_parsed = False
        if continued and not body.strip():  # the end of a region read piece by piece
            if self._region_parsed:
                self._trimmer.markup()
            else:  # every piece went back as text: so does the end marker
                out.append(ParsedDelta(content=self._trimmer.push(body + end)))
            return
        try:
            calls = self._fmt.parse_region(start, body)  # none: markup with no call in it (an empty section)
        except MarkupError as exc:
            raw = ("" if continued else start) + body + end
            if start:  # an unmarked (bare JSON) reply that is not a call is just the answer
                logger.warning("%s tool parser: markup returned as content (%s): %.200r", self._fmt.name, exc, raw)
            out.append(ParsedDelta(content=self._trimmer.push(raw)))
            return
        self._region_parsed = True
        self._trimmer.markup()
        if last:
            self._orphan = self._fmt.orphan_ends.get(start)
        out.extend(self._call_deltas(calls))

    def _call_deltas(self, calls: list[RawCall]) -> list[ParsedDelta]:
        """One delta per whole call: its index, id, name and arguments."""
        assert self._fmt is not None
        deltas = []
        for call in calls:
            deltas.append(
                ParsedDelta(
                    tool_index=self._next_index,
                    tool_id=call.id or self._fmt.new_id(),
                    tool_name=call.name,
                    arguments=call.arguments_json(),
                )
            )
            self._next_index += 1
        return deltas
