"""OpenAI Response objects and the strict event sequence of a streamed one.

A streamed response: ``response.created``, ``response.in_progress``, then each output item's
events (:mod:`.items`: ``reasoning``, ``message``, ``function_call``), then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it).
Every event has a ``sequence_number``; the response id is the same throughout. A failure
mid-stream is an ``error`` event then ``response.failed``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs

from ...errors import VllmMlxTrioError
from ...stream import Delta, RequestStream, Usage
from ..errors import describe
from .items import OutputItems
from .translate import ResponsesRequest


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


class ResponseBuilder:
    """The objects of one response: one id, one ``created_at``, the request's settings echoed."""

    def __init__(self, request: ResponsesRequest, model: str, count_tokens: Callable[[str], int] = len):
        """``count_tokens`` counts the tokens of a text (the reasoning's, for ``usage``)."""
        self.id = f"resp_{uuid.uuid4().hex}"
        self._count_tokens = count_tokens
        self._request = request
        self._model = model
        self._created_at = int(time.time())

    def response(
        self,
        *,
        status: str,
        output: list[dict[str, Any]],
        usage: Usage | None = None,
        finish_reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = self._request.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self._created_at,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "model": self._model,
            "output": output,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id,
            "store": self._request.store,
            "temperature": body.temperature if body.temperature is not None else 1.0,
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "tool_choice": body.tool_choice or "auto",
            "tools": body.tools or [],
            "text": {"format": _format_json(body)},
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "usage": None if usage is None else usage_json(usage),
        }

    def output_items(self, starts_in_reasoning: bool) -> OutputItems:
        plan = self._request.plan
        return OutputItems(
            plan.output, starts_in_reasoning=starts_in_reasoning, routes=plan.routes, forced_custom=plan.forced_custom
        )

    def final(self, items: OutputItems, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        """The finished response (non-streamed, or ``response.completed``'s)."""
        status = "incomplete" if finish_reason == "length" else "completed"
        reasoning = "".join(
            part["text"] for item in items.items if item["type"] == "reasoning" for part in item["content"]
        )
        usage = attrs.evolve(usage, reasoning_tokens=self._count_tokens(reasoning) if reasoning else 0)
        return self.response(status=status, output=items.items, usage=usage)

    def full(self, text: str, finish_reason: str | None, usage: Usage, *, starts_in_reasoning: bool) -> dict:
        """The non-streamed response: the whole text through the same items a stream builds."""
        items = self.output_items(starts_in_reasoning)
        items.feed(text)
        items.finish()
        return self.final(items, finish_reason, usage)


def _format_json(body: Any) -> dict[str, Any]:
    fmt = body.text.format if body.text is not None else None
    if fmt is None:
        return {"type": "text"}
    return {"type": fmt.__struct_config__.tag, **{k: v for k, v in msgspec_fields(fmt).items() if v is not None}}


def msgspec_fields(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__struct_fields__}


class ResponseEvents:
    """The events of one streamed response (an :class:`~..one_request.EventSource`).

    ``on_finished`` gets the final response object once ``response.completed`` is built
    (the route stores it).
    """

    def __init__(self, builder: ResponseBuilder, on_finished):
        self._builder = builder
        self._on_finished = on_finished
        self._sequence = 0
        self._items: OutputItems | None = None

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _events(self, events: list[tuple[str, dict[str, Any]]]) -> str:
        return "".join(self._event(kind, **fields) for kind, fields in events)

    def opening(self, stream: RequestStream) -> str:
        self._items = self._builder.output_items(stream.starts_in_reasoning)
        started = self._builder.response(status="in_progress", output=[])
        return self._event("response.created", response=started) + self._event("response.in_progress", response=started)

    def on_delta(self, delta: Delta) -> str:
        assert self._items is not None, "opening() comes first"
        return self._events(self._items.feed(delta.text))

    def closing(self, stream: RequestStream) -> str:
        assert self._items is not None, "opening() comes first"
        events = self._events(self._items.finish())
        final = self._builder.final(self._items, stream.finish_reason, stream.usage)
        self._on_finished(final)
        return events + self._event(f"response.{final['status']}", response=final)

    def on_error(self, exc: VllmMlxTrioError) -> str:
        _status, body, _headers = describe(exc)
        error = body["error"]
        code = error["code"] or error["type"]
        failed = self._builder.response(status="failed", output=[], error={"code": code, "message": error["message"]})
        return self._event("error", code=code, message=error["message"], param=error["param"]) + self._event(
            "response.failed", response=failed
        )

    def ping(self) -> str:
        return ": keep-alive\n\n"  # an SSE comment: the Responses protocol has no ping event
