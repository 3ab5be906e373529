"""gpt-oss harmony output: ``analysis`` is reasoning, ``final`` (and plain ``commentary``) is content,
``commentary to=functions.NAME ... <|message|>{json}<|call|>`` is a tool call.

    <|channel|>analysis<|message|>thinking<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"a": 1}<|call|>
    <|start|>assistant<|channel|>final<|message|>answer<|return|>

The recipient may also stand before the channel: ``<|start|>assistant to=functions.f<|channel|>commentary json``.
The text must keep the special tokens (detokenized without skipping them).

A call whose body starts as a JSON object opens as soon as that is seen and its text streams as written
(the fragments concatenate to its arguments); any other body is read whole at its terminator.
"""

from __future__ import annotations

import json
import logging
import re

from .json_formats import decode_arguments, decode_json_values
from .streamed_call import StreamedCall
from .text import find_first, partial_marker_len
from .types import MarkupError, ParsedDelta, RawCall, new_call_id

logger = logging.getLogger(__name__)

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
TERMINATORS = ("<|end|>", "<|call|>", "<|return|>", START)
#: A header opens with <|start|>, <|channel|>, or (the prompt ended with ``<|start|>assistant``) the
#: recipient: `` to=functions.f<|channel|>commentary json<|message|>``.
_HEADER_OPENERS = (START, CHANNEL, "to=")
#: A header longer than this without ``<|message|>`` is not one (the text goes out as content).
MAX_HEADER_CHARS = 512
#: Every harmony marker (special tokens: the detokenizer must keep them).
MARKUP = (START, CHANNEL, MESSAGE, "<|constrain|>", "<|end|>", "<|call|>", "<|return|>")
_RECIPIENT = re.compile(r"\bto=([^\s<]+)")
_FUNCTIONS = "functions."
#: A call body that starts as a JSON object does (the ``{`` and the character after it): it streams.
_OBJECT_START = re.compile(r'\s*(?=\{\s*["}])')


class HarmonyStream:
    """The harmony state machine: headers, then bodies streamed by channel until their terminator."""

    def __init__(self, *, calls: bool, starts_in_reasoning: bool = False) -> None:
        self._calls = calls
        self._pending = ""
        #: The prompt may end with ``<|channel|>analysis<|message|>``: the output starts in the body.
        self._in_header = not starts_in_reasoning
        self._channel = "analysis" if starts_in_reasoning else "final"
        self._recipient: str | None = None
        self._next_index = 0
        self._call: StreamedCall | None = None

    def feed(self, text: str) -> list[ParsedDelta]:
        self._pending += text
        out: list[ParsedDelta] = []
        while self._pending:
            before = (self._in_header, len(self._pending))
            if self._in_header:
                self._step_header(out)
            else:
                self._step_body(out)
            if (self._in_header, len(self._pending)) == before:
                break
        return out

    def finish(self) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        rest, self._pending = self._pending, ""
        if self._in_header:
            if rest.lstrip().startswith(_HEADER_OPENERS):  # a header cut off (max_tokens): markup only
                logger.debug("harmony: unfinished header at the end: %.200r", rest)
            else:  # text that only looked like the start of a header ("to", "<|")
                out.append(ParsedDelta(content=rest))
        elif self._call is not None:
            self._close_call(rest, out)
        elif self._recipient is not None:
            self._emit_call(rest, out)
        else:
            out.append(self._body_delta(rest))
        return [d for d in out if d != ParsedDelta()]

    def _step_header(self, out: list[ParsedDelta]) -> None:
        head = self._pending.lstrip()
        if not head or any(opener.startswith(head) for opener in _HEADER_OPENERS):
            return
        if not head.startswith(_HEADER_OPENERS):  # no header: plain text is the answer
            self._open_body("final", None)
            return
        at = head.find(MESSAGE)
        if at < 0:
            if len(head) > MAX_HEADER_CHARS:
                logger.warning("harmony: no <|message|> after a header; returned as content: %.200r", head)
                self._open_body("final", None)
            return
        channel, recipient = _read_header(head[:at])
        self._pending = head[at + len(MESSAGE) :]
        self._open_body(channel, recipient)

    def _open_body(self, channel: str, recipient: str | None) -> None:
        self._in_header = False
        self._channel = channel
        self._recipient = recipient

    def _step_body(self, out: list[ParsedDelta]) -> None:
        if self._call is not None or self._open_call(out):
            self._step_call(out)
            return
        found = find_first(self._pending, TERMINATORS)
        if found is None:
            if self._recipient is None:
                cut = len(self._pending) - partial_marker_len(self._pending, TERMINATORS)
                out.append(self._body_delta(self._pending[:cut]))
                self._pending = self._pending[cut:]
            return
        at, marker = found
        body = self._pending[:at]
        # <|start|> opens the next message: it stays for the header.
        self._pending = self._pending[at if marker == START else at + len(marker) :]
        if self._recipient is not None:
            self._emit_call(body, out)
        else:
            out.append(self._body_delta(body))
        self._in_header = True

    def _open_call(self, out: list[ParsedDelta]) -> bool:
        """Open a streamed call if this body is a function call's and starts as a JSON object does."""
        recipient = self._recipient
        if not (self._calls and recipient and recipient.startswith(_FUNCTIONS) and len(recipient) > len(_FUNCTIONS)):
            return False
        start = _OBJECT_START.match(self._pending)
        if start is None:
            return False
        name = recipient[len(_FUNCTIONS) :]
        self._call = StreamedCall(index=self._next_index, name=name, head=self._pending[: start.end()])
        self._next_index += 1
        self._pending = self._pending[start.end() :]
        out.append(ParsedDelta(tool_index=self._call.index, tool_id=new_call_id(), tool_name=name))
        return True

    def _step_call(self, out: list[ParsedDelta]) -> None:
        """Send the call's arguments seen so far; at its terminator, close it."""
        assert self._call is not None
        found = find_first(self._pending, TERMINATORS)
        limit = found[0] if found else len(self._pending) - partial_marker_len(self._pending, TERMINATORS)
        self._pending = self._pending[self._send(self._pending[:limit], out) :]
        found = find_first(self._pending, TERMINATORS)
        if found is None:
            return
        at, marker = found
        body = self._pending[:at]
        self._pending = self._pending[at if marker == START else at + len(marker) :]
        self._close_call(body, out)
        self._in_header = True

    def _send(self, text: str, out: list[ParsedDelta]) -> int:
        assert self._call is not None
        fragment, used = self._call.take_arguments(text)
        if fragment:
            out.append(ParsedDelta(tool_index=self._call.index, arguments=fragment))
        return used

    def _close_call(self, rest: str, out: list[ParsedDelta]) -> None:
        """The end of a streamed call's body: the last of its arguments, then a check (a WARNING if the body
        is not one JSON object: the call keeps the arguments sent)."""
        assert self._call is not None
        call = self._call
        call.tail = rest[self._send(rest, out) :]
        self._call, self._recipient = None, None
        try:
            values = decode_json_values(call.raw + call.tail)
            if len(values) != 1:
                raise MarkupError(f"{len(values)} JSON values in the call's body")
            calls: list | MarkupError = [RawCall(name=call.name, arguments=decode_arguments(values[0]))]
        except MarkupError as exc:
            calls = exc
        call.check(calls, "openai")

    def _body_delta(self, text: str) -> ParsedDelta:
        return ParsedDelta(reasoning=text) if self._channel == "analysis" else ParsedDelta(content=text)

    def _emit_call(self, body: str, out: list[ParsedDelta]) -> None:
        recipient, self._recipient = self._recipient or "", None
        try:
            if not self._calls:
                raise MarkupError("tool calls are not parsed (no tool parser)")
            if not recipient.startswith(_FUNCTIONS):
                raise MarkupError(f"recipient {recipient!r} is not a function")
            values = decode_json_values(body)
            if len(values) > 1:
                raise MarkupError("more than one JSON value")
            arguments = decode_arguments(values[0] if values else {})
        except MarkupError as exc:
            logger.warning("harmony: call to %s returned as content (%s): %.200r", recipient, exc, body)
            out.append(ParsedDelta(content=body))
            return
        out.append(
            ParsedDelta(
                tool_index=self._next_index,
                tool_id=new_call_id(),
                tool_name=recipient[len(_FUNCTIONS) :],
                arguments=json.dumps(arguments, ensure_ascii=False),
            )
        )
        self._next_index += 1


def _read_header(header: str) -> tuple[str, str | None]:
    """(channel, recipient) of a header such as ``<|start|>assistant<|channel|>commentary to=functions.f json``."""
    recipient = _RECIPIENT.search(header)
    _, _, after_channel = header.partition(CHANNEL)
    words = after_channel.replace("<|constrain|>", " ").split()
    channel = words[0] if words else "final"
    return channel, recipient.group(1) if recipient else None
