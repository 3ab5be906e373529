"""One streamed agent turn over HTTP: the reply as the client keeps it, its usage, its TTFT.

Each API's stream is read the way its client reads it: Anthropic's content blocks rebuilt from
``content_block_*`` events, the Responses output items from ``response.completed``, the chat
message from its deltas and the usage chunk.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import httpx


class TurnRefused(Exception):
    """The server answered the turn with an error status."""

    def __init__(self, status: int, body: str):
        super().__init__(f"{status}: {body}")
        self.status = status
        self.reason = _error_message(body)[:70]


def _error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
    except ValueError:
        return body
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


@attrs.frozen
class TurnResult:
    reply: dict[str, Any]
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft_s: float | None


async def send_turn(http: httpx.AsyncClient, url: str, path: str, body: dict, headers: dict) -> TurnResult:
    started = time.perf_counter()
    first: list[float] = []
    async with http.stream("POST", f"{url}{path}", json=body, headers=headers) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise TurnRefused(response.status_code, text)
        events = _events(response.aiter_lines())
        reader = {"/v1/messages": _anthropic, "/v1/responses": _responses}.get(path, _chat)
        reply, usage = await reader(events, lambda: first or first.append(time.perf_counter()))
    ttft = first[0] - started if first else None
    return TurnResult(reply=reply, ttft_s=ttft, **usage)


async def _events(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


async def _anthropic(events, mark) -> tuple[dict[str, Any], dict[str, int]]:
    blocks: list[dict[str, Any]] = []
    partial_json: dict[int, str] = {}
    usage = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
    async for event in events:
        kind = event["type"]
        if kind == "message_start":
            start = event["message"]["usage"]
            usage["cached_tokens"] = start.get("cache_read_input_tokens") or 0
            usage["prompt_tokens"] = start["input_tokens"] + usage["cached_tokens"]
        elif kind == "content_block_start":
            mark()
            blocks.append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            _apply_anthropic_delta(blocks[event["index"]], event["delta"], partial_json, event["index"])
        elif kind == "message_delta":
            final = event["usage"]
            usage["completion_tokens"] = final["output_tokens"]
            if final.get("cache_read_input_tokens") is not None:  # final counts, as the SDK reads them
                usage["cached_tokens"] = final["cache_read_input_tokens"]
                usage["prompt_tokens"] = final["input_tokens"] + usage["cached_tokens"]
        elif kind == "error":
            raise RuntimeError(f"stream error: {event}")
    for index, text in partial_json.items():
        blocks[index]["input"] = json.loads(text or "{}")
    return {"content": blocks}, usage


def _apply_anthropic_delta(block: dict[str, Any], delta: dict[str, Any], partial_json: dict, index: int) -> None:
    kind = delta["type"]
    if kind == "text_delta":
        block["text"] = block.get("text", "") + delta["text"]
    elif kind == "thinking_delta":
        block["thinking"] = block.get("thinking", "") + delta["thinking"]
    elif kind == "signature_delta":
        block["signature"] = delta["signature"]
    elif kind == "input_json_delta":
        partial_json[index] = partial_json.get(index, "") + delta["partial_json"]


async def _responses(events, mark) -> tuple[dict[str, Any], dict[str, int]]:
    final: dict[str, Any] | None = None
    async for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            mark()
        elif kind in ("response.completed", "response.incomplete"):
            final = event["response"]
        elif kind in ("error", "response.failed"):
            raise RuntimeError(f"stream error: {event}")
    if final is None:
        raise RuntimeError("the stream ended without response.completed")
    usage = final["usage"]
    return final, {
        "prompt_tokens": usage["input_tokens"],
        "cached_tokens": usage["input_tokens_details"]["cached_tokens"],
        "completion_tokens": usage["output_tokens"],
    }


async def _chat(events, mark) -> tuple[dict[str, Any], dict[str, int]]:
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    usage = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
    async for event in events:
        if "error" in event:
            raise RuntimeError(f"stream error: {event}")
        if event.get("usage"):
            used = event["usage"]
            usage = {
                "prompt_tokens": used["prompt_tokens"],
                "cached_tokens": (used.get("prompt_tokens_details") or {}).get("cached_tokens") or 0,
                "completion_tokens": used["completion_tokens"],
            }
        for choice in event.get("choices") or ():
            delta = choice["delta"]
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                mark()
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(call["index"], {"type": "function", "function": {"arguments": ""}})
                entry["id"] = call.get("id", entry.get("id"))
                function = call.get("function") or {}
                if function.get("name"):
                    entry["function"]["name"] = function["name"]
                entry["function"]["arguments"] += function.get("arguments") or ""
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}, usage
