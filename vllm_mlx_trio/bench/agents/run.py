"""Drive the agent sessions against a server and measure, turn by turn, what the prefix cache
gave back: ``reused_pct`` is the cached tokens of a turn over the previous turn's prompt plus
its reply (what the next prompt extends when the client replays the history as received)."""

from __future__ import annotations

from typing import Any

import httpx

from .client import TurnRefused, TurnResult, send_turn
from .shapes import SESSIONS, TEXTS

#: Seconds one turn may take (a long prompt's prefill on a CPU included).
TURN_TIMEOUT_S = 600.0


async def run_session(
    url: str, kind: str, model: str, *, turns: int, max_tokens: int, size: str = "full"
) -> list[dict[str, Any]]:
    session = SESSIONS[kind](model, max_tokens, TEXTS[size])
    rows: list[dict[str, Any]] = []
    previous: TurnResult | None = None
    async with httpx.AsyncClient(timeout=TURN_TIMEOUT_S) as http:
        for turn in range(1, turns + 1):
            body, headers = session.request()
            try:
                result = await send_turn(http, url, session.path, body, headers)
            except TurnRefused as refused:  # the session ends here, as the client's would
                rows.append(refused_row(kind, turn, refused))
                break
            rows.append(turn_row(kind, turn, result, previous))
            session.add_reply(result.reply, turn)
            previous = result
    return rows


def turn_row(kind: str, turn: int, result: TurnResult, previous: TurnResult | None) -> dict[str, Any]:
    extended = previous.prompt_tokens + previous.completion_tokens if previous is not None else None
    reused = "-" if not extended else f"{100.0 * min(result.cached_tokens, extended) / extended:.1f}"
    return {
        "session": kind,
        "turn": turn,
        "prompt_tokens": result.prompt_tokens,
        "cached_tokens": result.cached_tokens,
        "prev_prompt_plus_reply": extended if extended is not None else "-",
        "reused_pct": reused,
        "ttft_ms": "-" if result.ttft_s is None else f"{1000 * result.ttft_s:.0f}",
    }


def refused_row(kind: str, turn: int, refused: TurnRefused) -> dict[str, Any]:
    empty = dict.fromkeys(("prompt_tokens", "cached_tokens", "prev_prompt_plus_reply", "ttft_ms"), "-")
    return {"session": kind, "turn": turn, **empty, "reused_pct": f"refused: {refused.status} {refused.reason}"}


def reuse_summary(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per session: the lowest reuse from turn 2 on (the target is >= 95 %)."""
    lowest: dict[str, float] = {}
    for row in rows:
        if row["reused_pct"] != "-" and not str(row["reused_pct"]).startswith("refused"):
            lowest[row["session"]] = min(lowest.get(row["session"], 100.0), float(row["reused_pct"]))
    return {kind: f"{value:.1f}" for kind, value in lowest.items()}
