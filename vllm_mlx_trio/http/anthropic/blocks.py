"""A reply's text as Anthropic content blocks: ``thinking``, ``text`` and ``tool_use``.

The model's output parsers (``vllm_mlx_trio.parsers``) split the text as it streams; each piece opens a block
when its kind changes (a new call opens a new ``tool_use`` block) and adds a delta to it:
``thinking_delta``, ``text_delta``, or ``input_json_delta`` fragments of a call's arguments as
they are generated. The non-streamed Message is built by the same code from the same pieces,
so both give the same blocks.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ...parsers import ParsedDelta
from ..agent_output import OutputSpec

logger = logging.getLogger(__name__)

Event = tuple[str, dict[str, Any]]


class ContentBlocks:
    """Turns a reply's text into block events, and keeps the finished blocks."""

    def __init__(self, spec: OutputSpec | None, *, starts_in_reasoning: bool = False, omit_thinking: bool = False):
        """``omit_thinking`` (``thinking.display = "omitted"``): thinking blocks are opened and
        closed as the model thinks, with no text in them."""
        self._spec = spec
        self._omit_thinking = omit_thinking
        self._parser = None
        if spec is not None:
            self._parser = spec.new_parser(starts_in_reasoning=starts_in_reasoning)
        #: The blocks so far (a tool_use block's input is filled in when it closes).
        self.blocks: list[dict[str, Any]] = []
        self._open: tuple[str, int | None] | None = None
        self._arguments = ""
        self.called = False

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._parser is None:
            return self._piece(ParsedDelta(content=text))
        return [event for piece in self._parser.feed(text) for event in self._piece(piece)]

    def finish(self) -> list[Event]:
        events = [] if self._parser is None else [e for piece in self._parser.finish() for e in self._piece(piece)]
        return events + self._close()

    def _piece(self, piece: ParsedDelta) -> list[Event]:
        events: list[Event] = []
        if piece.reasoning:
            events += self._ensure(("thinking", None), {"type": "thinking", "thinking": "", "signature": ""})
            if not self._omit_thinking:
                self.blocks[-1]["thinking"] += piece.reasoning
                events.append(self._delta({"type": "thinking_delta", "thinking": piece.reasoning}))
        if piece.content:
            events += self._ensure(("text", None), {"type": "text", "text": ""})
            self.blocks[-1]["text"] += piece.content
            events.append(self._delta({"type": "text_delta", "text": piece.content}))
        if piece.tool_index is not None and (self._spec is None or self._spec.parallel or piece.tool_index == 0):
            events += self._tool_piece(piece)
        return events

    def _tool_piece(self, piece: ParsedDelta) -> list[Event]:
        key = ("tool_use", piece.tool_index)
        events: list[Event] = []
        if self._open != key:
            if piece.tool_id is None or piece.tool_name is None:
                return []  # not a call's first piece: nothing to add it to
            self.called = True
            events += self._ensure(key, {"type": "tool_use", "id": piece.tool_id, "name": piece.tool_name, "input": {}})
        if piece.arguments:
            self._arguments += piece.arguments
            events.append(self._delta({"type": "input_json_delta", "partial_json": piece.arguments}))
        return events

    def _ensure(self, key: tuple[str, int | None], block: dict[str, Any]) -> list[Event]:
        if self._open == key:
            return []
        events = self._close()
        self._open = key
        self.blocks.append(block)
        start = {"type": "content_block_start", "index": len(self.blocks) - 1, "content_block": dict(block)}
        return [*events, ("content_block_start", start)]

    def _delta(self, delta: dict[str, Any]) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": len(self.blocks) - 1, "delta": delta}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        events: list[Event] = []
        block = self.blocks[-1]
        if block["type"] == "thinking":
            events.append(self._delta({"type": "signature_delta", "signature": ""}))
        elif block["type"] == "tool_use":
            block["input"] = _input_object(self._arguments, block["name"])
            self._arguments = ""
        self._open = None
        events.append(("content_block_stop", {"type": "content_block_stop", "index": len(self.blocks) - 1}))
        return events


def _input_object(arguments: str, name: str) -> dict[str, Any]:
    """A call's arguments as the ``input`` object (the parsers give an object's JSON text)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        logger.warning("tool call %r has arguments that are not a JSON object; input is empty", name)
        return {}
    return value
