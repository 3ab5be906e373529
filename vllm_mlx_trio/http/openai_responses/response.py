"""OpenAI Response objects and the strict event sequence of a streamed one.

A streamed response: ``response.created``, ``response.in_progress``, then for its one
message item ``response.output_item.added`` -> ``response.content_part.added`` ->
``response.output_text.delta``... -> ``response.output_text.done`` ->
``response.content_part.done`` -> ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it).
Every event has a ``sequence_number``; the response id is the same throughout. A failure
mid-stream is an ``error`` event then ``response.failed``.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ...errors import VllmMlxTrioError
from ...stream import Delta, RequestStream, Usage
from ..errors import describe
from .translate import ResponsesRequest


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseBuilder:
    """The objects of one response: one id, one ``created_at``, the request's settings echoed."""

    def __init__(self, request: ResponsesRequest, model: str):
        self.id = f"resp_{uuid.uuid4().hex}"
        self.message_id = f"msg_{uuid.uuid4().hex}"
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
            "tools": [],
            "text": {"format": {"type": "text"}},
            "reasoning": {"effort": None, "summary": None},
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "usage": None if usage is None else usage_json(usage),
        }

    def message_item(self, text: str, *, status: str) -> dict[str, Any]:
        content = [] if status == "in_progress" else [text_part(text)]
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant", "content": content}

    def final(self, text: str, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        """The finished response (non-streamed, or ``response.completed``'s)."""
        status = "incomplete" if finish_reason == "length" else "completed"
        item_status = "incomplete" if status == "incomplete" else "completed"
        return self.response(status=status, output=[self.message_item(text, status=item_status)], usage=usage)


class ResponseEvents:
    """The events of one streamed response (an :class:`~..one_request.EventSource`).

    ``on_finished`` gets the final response object once ``response.completed`` is built
    (the route stores it).
    """

    def __init__(self, builder: ResponseBuilder, on_finished):
        self._builder = builder
        self._on_finished = on_finished
        self._sequence = 0
        self._texts: list[str] = []

    def _event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def _item_fields(self) -> dict[str, Any]:
        return {"item_id": self._builder.message_id, "output_index": 0, "content_index": 0}

    def opening(self, stream: RequestStream) -> str:
        started = self._builder.response(status="in_progress", output=[])
        return "".join([
            self._event("response.created", response=started),
            self._event("response.in_progress", response=started),
            self._event("response.output_item.added", output_index=0,
                        item=self._builder.message_item("", status="in_progress")),
            self._event("response.content_part.added", **self._item_fields(), part=text_part("")),
        ])  # fmt: skip

    def on_delta(self, delta: Delta) -> str:
        if not delta.text:
            return ""
        self._texts.append(delta.text)
        return self._event("response.output_text.delta", **self._item_fields(), delta=delta.text, logprobs=[])

    def closing(self, stream: RequestStream) -> str:
        text = "".join(self._texts)
        final = self._builder.final(text, stream.finish_reason, stream.usage)
        self._on_finished(final)
        return "".join([
            self._event("response.output_text.done", **self._item_fields(), text=text, logprobs=[]),
            self._event("response.content_part.done", **self._item_fields(), part=text_part(text)),
            self._event("response.output_item.done", output_index=0, item=final["output"][0]),
            self._event(f"response.{final['status']}", response=final),
        ])  # fmt: skip

    def on_error(self, exc: VllmMlxTrioError) -> str:
        _status, body, _headers = describe(exc)
        error = body["error"]
        code = error["code"] or error["type"]
        failed = self._builder.response(
            status="failed", output=[], error={"code": code, "message": error["message"]}
        )
        return "".join([
            self._event("error", code=code, message=error["message"], param=error["param"]),
            self._event("response.failed", response=failed),
        ])  # fmt: skip

    def ping(self) -> str:
        return ": keep-alive\n\n"  # an SSE comment: the Responses protocol has no ping event
