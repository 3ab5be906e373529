"""``OutputParser``: one per choice; splits the detokenized text into content, reasoning and tool calls."""

from __future__ import annotations

from collections.abc import Sequence

from .registry import HARMONY_REASONING, HARMONY_TOOLS, REASONING_PARSERS, TOOL_PARSERS
from .tool_stream import ToolStream
from .types import ParsedDelta, ParsedMessage, assemble_message


def _check_name(name: str | None, known: dict, what: str) -> None:
    if name is not None and name not in known:
        raise ValueError(f"unknown {what} parser {name!r}; known: {', '.join(sorted(known))}")


class OutputParser:
    """Feed the detokenized text as it streams; get the message pieces back.

    The reasoning parser runs first; only what it calls content reaches the tool parser, so
    tool calls are never parsed inside reasoning. ``message()`` after ``finish()`` is exactly
    what the deltas add up to.
    """

    def __init__(
        self,
        *,
        tool_parser: str | None,
        reasoning_parser: str | None,
        tools: Sequence[dict] | None = None,
        starts_in_reasoning: bool = False,
    ) -> None:
        _check_name(tool_parser, TOOL_PARSERS, "tool")
        _check_name(reasoning_parser, REASONING_PARSERS, "reasoning")
        self._deltas: list[ParsedDelta] = []
        self._finished = False
        self._harmony = None
        if tool_parser == HARMONY_TOOLS or reasoning_parser == HARMONY_REASONING:
            from .harmony import HarmonyStream

            self._harmony = HarmonyStream(calls=tool_parser == HARMONY_TOOLS, starts_in_reasoning=starts_in_reasoning)
            return
        reasoning_cls = REASONING_PARSERS.get(reasoning_parser) if reasoning_parser else None
        answer_starts = TOOL_PARSERS[tool_parser].reasoning_ends if tool_parser else ()
        self._reasoning = (
            reasoning_cls(starts_in_reasoning=starts_in_reasoning, answer_starts=answer_starts)
            if reasoning_cls
            else None
        )
        self._tools = ToolStream(TOOL_PARSERS[tool_parser](tools) if tool_parser else None)

    def feed(self, text: str) -> list[ParsedDelta]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if self._harmony is not None:
            return self._keep(self._harmony.feed(text))
        pieces = self._reasoning.feed(text) if self._reasoning else [("content", text)]
        return self._keep(self._route(pieces, final=False))

    def finish(self) -> list[ParsedDelta]:
        if self._finished:
            return []
        self._finished = True
        if self._harmony is not None:
            return self._keep(self._harmony.finish())
        pieces = self._reasoning.finish() if self._reasoning else []
        return self._keep(self._route(pieces, final=True))

    def message(self) -> ParsedMessage:
        """The whole message so far (after ``finish()``: the final one)."""
        return assemble_message(self._deltas)

    def _route(self, pieces: list[tuple[str, str]], *, final: bool) -> list[ParsedDelta]:
        out: list[ParsedDelta] = []
        for kind, text in pieces:
            if kind == "reasoning":
                out.append(ParsedDelta(reasoning=text))
            else:
                out.extend(self._tools.feed(text))
        if final:
            out.extend(self._tools.finish())
        return out

    def _keep(self, deltas: list[ParsedDelta]) -> list[ParsedDelta]:
        """The non-empty deltas, neighbours of the same kind of text joined (fewer chunks to send)."""
        kept: list[ParsedDelta] = []
        for delta in deltas:
            if delta == ParsedDelta():
                continue
            kind = _text_kind(delta)
            if kept and kind is not None and _text_kind(kept[-1]) == kind:
                last = kept.pop()
                delta = ParsedDelta(content=last.content + delta.content, reasoning=last.reasoning + delta.reasoning)
            kept.append(delta)
        self._deltas.extend(kept)
        return kept


def _text_kind(delta: ParsedDelta) -> str | None:
    """ "content" or "reasoning" for a delta of only that text; None for a call's piece."""
    if delta.tool_index is not None:
        return None
    if not delta.reasoning:
        return "content"
    return "reasoning" if not delta.content else None


def parse_text(
    text: str,
    *,
    tool_parser: str | None,
    reasoning_parser: str | None,
    tools: Sequence[dict] | None = None,
    starts_in_reasoning: bool = False,
) -> ParsedMessage:
    """The whole message of ``text``: ``feed`` + ``finish`` in one."""
    parser = OutputParser(
        tool_parser=tool_parser, reasoning_parser=reasoning_parser, tools=tools, starts_in_reasoning=starts_in_reasoning
    )
    parser.feed(text)
    parser.finish()
    return parser.message()
