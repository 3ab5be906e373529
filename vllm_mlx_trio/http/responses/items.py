"""A reply's text as Responses output items: ``reasoning``, ``message`` and ``function_call``.

The model's output parsers (``vllm_mlx_trio.parsers``) split the text as it streams; each piece opens an item
when its kind changes (each call is an item of its own) and adds a delta to it. Events come
out as (type, fields) pairs without ``sequence_number`` (the caller numbers them):
``output_item.added`` (and ``content_part.added`` for a message) before any content event
of that ``output_index``, every added item closed by its ``.done`` events and
``output_item.done``. The non-streamed response is built from the same pieces.
"""

from __future__ import annotations

import uuid
from typing import Any

from ...parsers import ParsedDelta
from ..agent_output import OutputSpec

Event = tuple[str, dict[str, Any]]


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """Turns a reply's text into item events, and keeps the finished items."""

    def __init__(self, spec: OutputSpec | None, *, starts_in_reasoning: bool = False):
        self._spec = spec
        self._parser = None
        if spec is not None:
            self._parser = spec.new_parser(starts_in_reasoning=starts_in_reasoning)
        self.items: list[dict[str, Any]] = []
        self._open: tuple[str, int | None] | None = None
        self.called = False

    def feed(self, text: str) -> list[Event]:
        if not text:
            return []
        if self._parser is None:
            return self._piece(ParsedDelta(content=text))
        return [event for piece in self._parser.feed(text) for event in self._piece(piece)]

    def finish(self) -> list[Event]:
        events = [] if self._parser is None else [e for piece in self._parser.finish() for e in self._piece(piece)]
        events += self._close()
        if not self.items:  # an empty reply is an empty message, as without parsers
            events += self._open_item(("message", None)) + self._close()
        return events

    def _piece(self, piece: ParsedDelta) -> list[Event]:
        events: list[Event] = []
        if piece.reasoning:
            events += self._open_item(("reasoning", None))
            self.items[-1]["content"][0]["text"] += piece.reasoning
            events.append(("response.reasoning_text.delta", {**self._where(), "delta": piece.reasoning}))
        if piece.content:
            events += self._open_item(("message", None))
            self.items[-1]["content"][0]["text"] += piece.content
            events.append(("response.output_text.delta", {**self._where(), "delta": piece.content, "logprobs": []}))
        if piece.tool_index is not None and (self._spec is None or self._spec.parallel or piece.tool_index == 0):
            key = ("function_call", piece.tool_index)
            if self._open != key and piece.tool_id is not None and piece.tool_name is not None:
                self.called = True
                events += self._open_item(key, call_id=piece.tool_id, name=piece.tool_name)
            if self._open == key and piece.arguments:
                self.items[-1]["arguments"] += piece.arguments
                where = {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1}
                events.append(("response.function_call_arguments.delta", {**where, "delta": piece.arguments}))
        return events

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.items[-1]["id"], "output_index": len(self.items) - 1, "content_index": 0}

    def _open_item(self, key: tuple[str, int | None], **call: str) -> list[Event]:
        if self._open == key:
            return []
        events = self._close()
        self._open = key
        kind = key[0]
        if kind == "message":
            item = {
                "type": "message",
                "id": _new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [text_part("")],
            }
        elif kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": _new_id("rs"),
                "summary": [],
                "content": [{"type": "reasoning_text", "text": ""}],
                "status": "in_progress",
            }
        else:
            item = {
                "type": "function_call",
                "id": _new_id("fc"),
                "call_id": call["call_id"],
                "name": call["name"],
                "arguments": "",
                "status": "in_progress",
            }
        self.items.append(item)
        index = len(self.items) - 1
        added = {**item, "content": []} if "content" in item else dict(item)
        events.append(("response.output_item.added", {"output_index": index, "item": added}))
        if kind == "message":
            events.append(("response.content_part.added", {**self._where(), "part": text_part("")}))
        return events

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        item = self.items[-1]
        item["status"] = "completed"
        index = len(self.items) - 1
        events: list[Event] = []
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(("response.output_text.done", {**self._where(), "text": text, "logprobs": []}))
            events.append(("response.content_part.done", {**self._where(), "part": item["content"][0]}))
        elif item["type"] == "reasoning":
            events.append(("response.reasoning_text.done", {**self._where(), "text": item["content"][0]["text"]}))
        else:
            done = {"item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]}
            events.append(("response.function_call_arguments.done", done))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
        self._open = None
        return events
