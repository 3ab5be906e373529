"""A reply's text as Responses output items: ``reasoning``, ``message``, ``function_call`` and
``custom_tool_call`` (a call of a custom tool, or a reply forced to be one; its input is sent
whole when the call ends). A call of a namespaced tool carries its ``namespace``.

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
from .tool_kinds import ToolRoute, custom_input

Event = tuple[str, dict[str, Any]]


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """Turns a reply's text into item events, and keeps the finished items."""

    def __init__(
        self,
        spec: OutputSpec | None,
        *,
        starts_in_reasoning: bool = False,
        routes: dict[str, ToolRoute] | None = None,
        forced_custom: ToolRoute | None = None,
    ):
        self._spec = spec
        self._routes = routes or {}
        self._forced_custom = forced_custom
        self._custom_arguments = ""
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
        if piece.content and self._forced_custom is not None:
            events += self._open_item(
                ("custom_tool_call", None), call_id=_new_id("call"), name=self._forced_custom.name
            )
            self._custom_arguments += piece.content
        elif piece.content:
            events += self._open_item(("message", None))
            self.items[-1]["content"][0]["text"] += piece.content
            events.append(("response.output_text.delta", {**self._where(), "delta": piece.content, "logprobs": []}))
        if piece.tool_index is not None and (self._spec is None or self._spec.parallel or piece.tool_index == 0):
            key = ("function_call", piece.tool_index)
            if self._open != key and piece.tool_id is not None and piece.tool_name is not None:
                self.called = True
                events += self._open_item(key, call_id=piece.tool_id, name=piece.tool_name)
            if self._open == key and piece.arguments and self.items[-1]["type"] == "custom_tool_call":
                self._custom_arguments += piece.arguments
            elif self._open == key and piece.arguments:
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
            item = self._call_item(kind, call["call_id"], call["name"])
        self.items.append(item)
        index = len(self.items) - 1
        added = {**item, "content": []} if "content" in item else dict(item)
        events.append(("response.output_item.added", {"output_index": index, "item": added}))
        if kind == "message":
            events.append(("response.content_part.added", {**self._where(), "part": text_part("")}))
        return events

    def _call_item(self, kind: str, call_id: str, name: str) -> dict[str, Any]:
        """A call's item as the client routes it: a custom tool's, or a function's (with its
        namespace when it has one), under the tool's own name."""
        route = self._routes.get(name)
        if kind == "custom_tool_call" or (route is not None and route.kind == "custom"):
            self._custom_arguments = ""
            item = {"type": "custom_tool_call", "id": _new_id("ctc"), "call_id": call_id, "name": name, "input": ""}
        else:
            item = {"type": "function_call", "id": _new_id("fc"), "call_id": call_id, "name": name, "arguments": ""}
            item["status"] = "in_progress"
        if route is not None:
            item["name"] = route.name
            if route.namespace is not None:
                item["namespace"] = route.namespace
        return item

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        item = self.items[-1]
        index = len(self.items) - 1
        events: list[Event] = []
        if item["type"] == "custom_tool_call":
            forced = self._forced_custom is not None and self._open == ("custom_tool_call", None)
            item["input"] = self._custom_arguments if forced else custom_input(self._custom_arguments)
            where = {"item_id": item["id"], "output_index": index}
            if item["input"]:
                events.append(("response.custom_tool_call_input.delta", {**where, "delta": item["input"]}))
            events.append(("response.custom_tool_call_input.done", {**where, "input": item["input"]}))
        else:
            item["status"] = "completed"
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append(("response.output_text.done", {**self._where(), "text": text, "logprobs": []}))
            events.append(("response.content_part.done", {**self._where(), "part": item["content"][0]}))
        elif item["type"] == "reasoning":
            events.append(("response.reasoning_text.done", {**self._where(), "text": item["content"][0]["text"]}))
        elif item["type"] == "function_call":
            done = {"item_id": item["id"], "output_index": index, "name": item["name"], "arguments": item["arguments"]}
            events.append(("response.function_call_arguments.done", done))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
        self._open = None
        return events
