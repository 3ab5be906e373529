"""Anthropic Message objects and the stream's events for one request.

The content blocks come from :class:`.blocks.ContentBlocks`. Usage follows Anthropic's
meaning: ``input_tokens`` are the prompt tokens *not* read from the prefix cache,
``cache_read_input_tokens`` those that were, so their sum is the prompt's length (what
``count_tokens`` returns). ``message_start`` goes out as soon as the request is admitted,
before the prefix cache lookup is known: it reports the whole prompt as ``input_tokens``;
``message_delta`` carries the final split (the sum is the same in both).
"""

from __future__ import annotations

import uuid
from typing import Any

from ...errors import VllmMlxTrioError
from ...stream import Delta, RequestStream, Usage
from ..agent_output import OutputSpec
from .blocks import ContentBlocks
from .errors import error_event, sse_event

#: The engine's finish reasons as Anthropic stop reasons (a stop string: ``stop_sequence``).
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason(finish_reason: str | None, stop_sequence: str | None, *, called: bool = False) -> str:
    if stop_sequence is not None:
        return "stop_sequence"
    if called and finish_reason == "stop":
        return "tool_use"
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
    *,
    model: str,
    text: str,
    finish_reason: str | None,
    stop_sequence: str | None,
    usage: Usage,
    output: OutputSpec | None = None,
    starts_in_reasoning: bool = False,
    omit_thinking: bool = False,
) -> dict[str, Any]:
    """The non-streamed answer: the whole text through the same blocks a stream builds."""
    blocks = ContentBlocks(output, starts_in_reasoning=starts_in_reasoning, omit_thinking=omit_thinking)
    blocks.feed(text)
    blocks.finish()
    return message_json(
        message_id=new_message_id(),
        model=model,
        content=blocks.blocks,
        stop_reason=stop_reason(finish_reason, stop_sequence, called=blocks.called),
        stop_sequence=stop_sequence,
        usage=usage_json(usage),
    )


class MessageEvents:
    """The events of one streamed Message (an :class:`~..one_request.EventSource`)."""

    def __init__(self, model: str, output: OutputSpec | None = None, *, omit_thinking: bool = False):
        self._model = model
        self._output = output
        self._omit_thinking = omit_thinking
        self._id = new_message_id()
        self._blocks: ContentBlocks | None = None

    def opening(self, stream: RequestStream) -> str:
        self._blocks = ContentBlocks(
            self._output, starts_in_reasoning=stream.starts_in_reasoning, omit_thinking=self._omit_thinking
        )
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
        assert self._blocks is not None, "opening() comes first"
        return _events(self._blocks.feed(delta.text))

    def closing(self, stream: RequestStream) -> str:
        assert self._blocks is not None, "opening() comes first"
        events = _events(self._blocks.finish())
        stop_sequence = stream.stop_sequence
        reason = stop_reason(stream.finish_reason, stop_sequence, called=self._blocks.called)
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence}
        events += sse_event(
            "message_delta", {"type": "message_delta", "delta": delta, "usage": usage_json(stream.usage)}
        )
        return events + sse_event("message_stop", {"type": "message_stop"})

    def on_error(self, exc: VllmMlxTrioError) -> str:
        return error_event(exc)

    def ping(self) -> str:
        return sse_event("ping", {"type": "ping"})


def _events(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(sse_event(name, payload) for name, payload in events)
