"""Anthropic Message objects and the stream's events for one request.

Usage follows Anthropic's meaning: ``input_tokens`` are the prompt tokens *not* read from
the prefix cache, ``cache_read_input_tokens`` those that were, so their sum is the prompt's
length (what ``count_tokens`` returns). ``message_start`` goes out as soon as the request
is admitted, before the prefix cache lookup is known: it reports the whole prompt as
``input_tokens``; ``message_delta`` carries the final split (the sum is the same in both).
"""

from __future__ import annotations

import uuid
from typing import Any

from ...errors import VllmMlxTrioError
from ...stream import Delta, RequestStream, Usage
from .errors import error_event, sse_event

#: The engine's finish reasons as Anthropic stop reasons (a stop string: ``stop_sequence``).
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(finish_reason or "stop", "end_turn")


def usage_json(usage: Usage) -> dict[str, int]:
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


def message_json(
    *,
    message_id: str,
    model: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, int],
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def full_message(
    *, model: str, text: str, finish_reason: str | None, stop_sequence: str | None, usage: Usage
) -> dict[str, Any]:
    """The non-streamed answer."""
    return message_json(
        message_id=new_message_id(),
        model=model,
        content=[{"type": "text", "text": text}] if text else [],
        stop_reason=stop_reason(finish_reason, stop_sequence),
        stop_sequence=stop_sequence,
        usage=usage_json(usage),
    )


class MessageEvents:
    """The events of one streamed Message (an :class:`~..one_request.EventSource`).

    The text block opens with the first text and closes before ``message_delta``; a reply
    with no text has no content block, as Anthropic's own.
    """

    def __init__(self, model: str):
        self._model = model
        self._id = new_message_id()
        self._text_open = False

    def opening(self, stream: RequestStream) -> str:
        usage = {
            "input_tokens": stream.num_prompt_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        message = message_json(
            message_id=self._id, model=self._model, content=[], stop_reason=None, stop_sequence=None, usage=usage
        )
        return sse_event("message_start", {"type": "message_start", "message": message})

    def on_delta(self, delta: Delta) -> str:
        if not delta.text:
            return ""
        events = []
        if not self._text_open:
            self._text_open = True
            block = {"type": "text", "text": ""}
            events.append(sse_event("content_block_start", {"type": "content_block_start", "index": 0,
                                                            "content_block": block}))
        text_delta = {"type": "text_delta", "text": delta.text}
        events.append(sse_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                        "delta": text_delta}))
        return "".join(events)

    def closing(self, stream: RequestStream) -> str:
        events = []
        if self._text_open:
            events.append(sse_event("content_block_stop", {"type": "content_block_stop", "index": 0}))
        stop_sequence = stream.stop_sequence
        delta = {"stop_reason": stop_reason(stream.finish_reason, stop_sequence), "stop_sequence": stop_sequence}
        events.append(sse_event("message_delta", {"type": "message_delta", "delta": delta,
                                                  "usage": usage_json(stream.usage)}))
        events.append(sse_event("message_stop", {"type": "message_stop"}))
        return "".join(events)

    def on_error(self, exc: VllmMlxTrioError) -> str:
        return error_event(exc)

    def ping(self) -> str:
        return sse_event("ping", {"type": "ping"})
