"""OpenAI response objects and SSE chunks for chat and text completions."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..stream import Usage


class ResponseBuilder:
    """Builds the objects of one response: same id, ``created`` and model throughout."""

    def __init__(self, *, chat: bool, model: str):
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def full(self, text: str, finish_reason: str | None, usage: Usage) -> dict[str, Any]:
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
            body = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage_json(usage)
        return body

    def chunk(self, text: str, finish_reason: str | None = None, *, first: bool = False) -> str:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
            if finish_reason is not None and not text:
                delta = {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return sse(self._envelope("chat.completion.chunk", [choice]))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return sse(self._envelope("text_completion", [choice]))

    def usage_chunk(self, usage: Usage) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = self._envelope(kind, [])
        body["usage"] = usage_json(usage)
        return sse(body)


def usage_json(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
