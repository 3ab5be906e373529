"""Claude Code's current request shape on /v1/messages: adaptive thinking with its thinking not
displayed, ``context_management`` clearing earlier thinking (or keeping it), the effort, a JSON
``metadata.user_id``, replayed signed thinking blocks with no text, its beta headers and session
id. Accepted, and each part honoured where it means something here."""

from __future__ import annotations

import httpx
import msgspec
import pytest
import trio

from vllm_mlx_trio.http.agent_output import OutputSpec
from vllm_mlx_trio.http.anthropic import schemas
from vllm_mlx_trio.http.anthropic.blocks import ContentBlocks
from vllm_mlx_trio.http.anthropic.translate import build_turns
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
TIMEOUT_S = 20
HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,context-management-2025-06-27,"
    "prompt-caching-scope-2026-01-05,effort-2025-11-24",
    "x-app": "cli",
    "x-claude-code-session-id": "2f0c6f5e-8a51-4c2e-9a53-6f1d0a6c0b7e",
}


def claude_code_body(**changes) -> dict:
    """A Claude Code 2.1.2xx body: three system blocks, a replayed turn with a signed empty
    thinking block, the marker on the last block of the last message."""
    body = {
        "model": MODEL,
        # Claude Code sends 32000, more than the fake model's context (a 400 here, as in vLLM)
        "max_tokens": 1000,
        "stream": False,
        "metadata": {"user_id": '{"device_id":"' + "ab" * 32 + '","account_uuid":"","session_id":"s-1"}'},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.283.0d9; cc_entrypoint=cli; cch=fa690;",
            },
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "", "signature": "EqQBCkgIBRABGAIiQ"},
                    {"type": "text", "text": "Sure."},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "text", "text": "Go on.", "cache_control": {"type": "ephemeral"}}],
            },
        ],
    }
    body.update(changes)
    return body


async def post(srv, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
        return await http.post(f"{srv.url}/v1/messages?beta=true", json=body, headers=HEADERS)


@pytest.mark.parametrize("stream", [False, True])
async def test_claude_codes_current_body_is_answered(fake_cfg, stream):
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(fake_cfg) as srv:
            response = await post(srv, claude_code_body(stream=stream))
    assert response.status_code == 200, response.text
    if stream:
        assert "event: message_stop" in response.text
    else:
        assert response.json()["content"][0]["text"] == "Hello, world!"


async def test_an_edit_this_server_does_not_apply_is_refused_by_name(fake_cfg):
    edits = {"edits": [{"type": "clear_thinking_20251015"}, {"type": "clear_tool_uses_20250919"}]}
    with trio.fail_after(TIMEOUT_S):
        async with fake_server(fake_cfg) as srv:
            response = await post(srv, claude_code_body(context_management=edits))
    assert response.status_code == 400
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("context_management.edits.1.type:")


def history(*thoughts: str) -> list[dict]:
    """User / assistant turns, each assistant turn thinking ``thought`` before its answer."""
    turns: list[dict] = []
    for i, thought in enumerate(thoughts):
        turns.append({"role": "user", "content": f"question {i}"})
        blocks = [{"type": "thinking", "thinking": thought, "signature": "sig"}, {"type": "text", "text": f"a{i}"}]
        turns.append({"role": "assistant", "content": blocks})
    return [*turns, {"role": "user", "content": "last"}]


def reasoning_of(context_management: dict | None, *thoughts: str) -> list[str | None]:
    body = {"model": MODEL, "max_tokens": 10, "messages": history(*thoughts)}
    if context_management is not None:
        body["context_management"] = context_management
    turns = build_turns(msgspec.convert(body, schemas.MessagesBody))
    return [turn.reasoning for turn in turns if turn.role == "assistant"]


def clear(keep) -> dict:
    return {"edits": [{"type": "clear_thinking_20251015", "keep": keep}]}


def test_clearing_thinking_keeps_what_keep_says():
    assert reasoning_of(None, "t0", "t1", "t2") == [None, None, None]  # cleared, as templates clear it
    assert reasoning_of(clear("all"), "t0", "t1", "t2") == ["t0", "t1", "t2"]
    assert reasoning_of(clear({"type": "all"}), "t0", "t1") == ["t0", "t1"]
    assert reasoning_of({"edits": [{"type": "clear_thinking_20251015"}]}, "t0", "t1") == [None, "t1"]  # one
    assert reasoning_of(clear({"type": "thinking_turns", "value": 2}), "t0", "t1", "t2") == [None, "t1", "t2"]
    assert reasoning_of(clear({"type": "thinking_turns", "value": 1}), "t0", "", "t2") == [None, None, "t2"]
    assert reasoning_of(clear({"type": "thinking_turns", "value": 0}), "t0", "t1") == [None, None]


@pytest.mark.parametrize("omit", [False, True])
def test_omitted_thinking_keeps_its_block_but_not_its_text(omit):
    blocks = ContentBlocks(OutputSpec(tool_parser=None, reasoning_parser="qwen3"), omit_thinking=omit)
    events = blocks.feed("<think>secret plan</think>The answer.") + blocks.finish()
    assert [b["type"] for b in blocks.blocks] == ["thinking", "text"]
    assert blocks.blocks[0]["thinking"] == ("" if omit else "secret plan")
    deltas = [e[1]["delta"]["type"] for e in events if e[0] == "content_block_delta"]
    assert ("thinking_delta" in deltas) is not omit and "text_delta" in deltas
    assert blocks.blocks[1]["text"] == "The answer."
