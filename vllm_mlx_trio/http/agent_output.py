"""A chat choice's text through the model's output parsers: reasoning, content, tool calls.

One :class:`ChoiceOutput` per choice, streaming or not (the non-streamed message is the
streamed deltas put together by the same parser, so both give the same calls). The deltas are
OpenAI's: ``reasoning_content`` (and ``reasoning``, the alias some clients read), ``content``,
``tool_calls`` entries with ``index`` and, on a call's first delta only, ``id``, ``type`` and
``function.name``; a call's ``function.arguments`` fragments concatenate to its final JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from ..output_format import OutputFormat
from ..parsers import OutputParser, ParsedDelta, ParsedMessage

#: The finish reason of a choice that stopped normally after calling tools.
TOOL_CALLS_FINISH = "tool_calls"


@attrs.frozen(kw_only=True)
class OutputSpec:
    """How one request's choices are parsed."""

    tool_parser: str | None
    reasoning_parser: str | None
    tools: tuple[dict[str, Any], ...] | None = None
    #: More than one call may be returned (``parallel_tool_calls``); else only the first.
    parallel: bool = True
    #: The reasoning goes out in the reply (``include_reasoning``); it is split and counted either way.
    include_reasoning: bool = True
    #: Reasoning deltas leave as generated; else held and sent in one delta when the reasoning ends.
    stream_reasoning: bool = True

    def new_parser(self, *, starts_in_reasoning: bool = False) -> OutputParser:
        """A parser for one choice's reply."""
        return OutputParser(
            tool_parser=self.tool_parser,
            reasoning_parser=self.reasoning_parser,
            tools=self.tools,
            starts_in_reasoning=starts_in_reasoning,
        )


def count_text_tokens(tokenizer: Any, text: str) -> int:
    """The tokens ``text`` encodes to (no special tokens added): a split-out reasoning's count."""
    return len(tokenizer.encode(text, add_special_tokens=False)) if text else 0


def output_spec(
    output: OutputFormat,
    *,
    tools: Sequence[dict[str, Any]] | None,
    parse_calls: bool,
    parallel: bool,
    reasoning: tuple[bool, bool, bool] = (True, True, True),
    tool_parser: str | None = None,
) -> OutputSpec | None:
    """The parsing a chat request's choices go through; None when nothing is parsed (no
    reasoning parser, and no tools whose calls are parsed): the text is the content, as ever.
    ``reasoning`` is (include, separate, stream) as the request's reasoning options set them;
    not separate: no reasoning parser (the thinking stays in the content). ``tool_parser``: the
    parser of this request's calls when not the model's (forced calls in another markup)."""
    include, separate, stream = reasoning
    tool_parser = (tool_parser or output.tool_parser) if parse_calls else None
    reasoning_parser = output.reasoning_parser if separate else None
    if tool_parser is None and reasoning_parser is None:
        return None
    return OutputSpec(
        tool_parser=tool_parser,
        reasoning_parser=reasoning_parser,
        tools=tuple(tools) if tools else None,
        parallel=parallel,
        include_reasoning=include,
        stream_reasoning=stream,
    )


class ChoiceOutput:
    """One choice's parser: text in, OpenAI delta dicts out; then the whole message."""

    def __init__(self, spec: OutputSpec, *, starts_in_reasoning: bool = False):
        self._spec = spec
        self._parser = spec.new_parser(starts_in_reasoning=starts_in_reasoning)
        self._called = False
        self._reasoning: list[str] = []
        self._held_reasoning = ""

    @property
    def reasoning_text(self) -> str:
        """The reasoning split out so far (whether or not the reply carries it)."""
        return "".join(self._reasoning)

    def feed(self, text: str) -> list[dict[str, Any]]:
        """The deltas this text completes (possibly none: markup being held back)."""
        return self._deltas(self._parser.feed(text)) if text else []

    def finish(self) -> list[dict[str, Any]]:
        """The deltas of the text held back until the end."""
        return self._deltas(self._parser.finish(), final=True)

    def finish_reason(self, reason: str | None) -> str | None:
        """``tool_calls`` for a choice that stopped normally after calling tools."""
        return TOOL_CALLS_FINISH if reason == "stop" and self._called else reason

    def message(self) -> dict[str, Any]:
        """After :meth:`finish`: the assistant message's fields (no ``role``)."""
        return message_fields(self._parser.message(), self._spec)

    def _deltas(self, pieces: list[ParsedDelta], *, final: bool = False) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for piece in pieces:
            if piece.tool_index is not None and (self._spec.parallel or piece.tool_index == 0):
                self._called = True
            if piece.reasoning:
                self._reasoning.append(piece.reasoning)
            for shown in self._shown(piece):
                _append(deltas, _delta(shown, self._spec))
        if final and self._held_reasoning:
            _append(deltas, _delta(ParsedDelta(reasoning=self._release_reasoning()), self._spec))
        return [delta for delta in deltas if delta]

    def _shown(self, piece: ParsedDelta) -> list[ParsedDelta]:
        """The piece as the reply shows it: reasoning left out (``include_reasoning: false``), or
        held until the first piece after it (``stream_reasoning: false``)."""
        if not piece.reasoning:
            shown = [piece]
        elif not self._spec.include_reasoning:
            shown = [attrs.evolve(piece, reasoning="")]
        elif not self._spec.stream_reasoning:
            self._held_reasoning += piece.reasoning
            shown = [attrs.evolve(piece, reasoning="")]
        else:
            return [piece]
        if self._held_reasoning and (shown[0].content or shown[0].tool_index is not None):
            shown.insert(0, ParsedDelta(reasoning=self._release_reasoning()))
        return shown

    def _release_reasoning(self) -> str:
        held, self._held_reasoning = self._held_reasoning, ""
        return held


def _delta(piece: ParsedDelta, spec: OutputSpec) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if piece.reasoning:
        delta["reasoning_content"] = delta["reasoning"] = piece.reasoning
    if piece.content:
        delta["content"] = piece.content
    if piece.tool_index is not None and (spec.parallel or piece.tool_index == 0):
        call: dict[str, Any] = {"index": piece.tool_index}
        if piece.tool_id is not None:
            call["id"] = piece.tool_id
            call["type"] = "function"
        function: dict[str, Any] = {}
        if piece.tool_name is not None:
            function["name"] = piece.tool_name
        function["arguments"] = piece.arguments
        call["function"] = function
        delta["tool_calls"] = [call]
    return delta


def _append(deltas: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    """Add ``delta``, merged into the previous one when both carry only text of the same
    kind, or only argument fragments of the same call (fewer, larger chunks; same result)."""
    if not delta:
        return
    last = deltas[-1] if deltas else None
    if last is not None and last.keys() == delta.keys():
        if delta.keys() == {"content"}:
            last["content"] += delta["content"]
            return
        if delta.keys() == {"reasoning_content", "reasoning"}:
            last["reasoning_content"] += delta["reasoning_content"]
            last["reasoning"] = last["reasoning_content"]
            return
        if delta.keys() == {"tool_calls"} and _continues(last["tool_calls"][-1], delta["tool_calls"][0]):
            last["tool_calls"][-1]["function"]["arguments"] += delta["tool_calls"][0]["function"]["arguments"]
            return
    deltas.append(delta)


def _continues(previous: dict[str, Any], call: dict[str, Any]) -> bool:
    return previous["index"] == call["index"] and "id" not in call and "name" not in call["function"]


def message_fields(message: ParsedMessage, spec: OutputSpec) -> dict[str, Any]:
    """``content`` (null when the reply is only calls or only reasoning), the reasoning (when
    the model has a reasoning parser) and ``tool_calls`` (when it made any)."""
    calls = message.tool_calls if spec.parallel else message.tool_calls[:1]
    content = message.content or None
    if content is None and not calls and not message.reasoning:
        content = ""  # an empty reply is empty content, as without parsers
    fields: dict[str, Any] = {"content": content}
    if spec.reasoning_parser is not None and spec.include_reasoning:
        fields["reasoning_content"] = fields["reasoning"] = message.reasoning or None
    if calls:
        fields["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call in calls
        ]
    return fields
