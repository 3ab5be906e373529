"""``bench agents``: the three client shapes run end to end against the real server and each
turn from the second on reuses the previous prompt from the prefix cache."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio.bench.agents.run import reuse_summary, run_session
from vllm_mlx_trio.bench.agents.shapes import SESSIONS, billing_header
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx


async def test_every_session_shape_is_answered_and_reuses_the_previous_prompt(demo_cfg):
    rows = []
    with trio.fail_after(240):
        async with open_server(demo_cfg) as srv:
            for kind in SESSIONS:
                rows += await run_session(srv.url, kind, "demo:tiny", turns=2, max_tokens=8, size="compact")
    assert [(row["session"], row["turn"]) for row in rows] == [(kind, turn) for kind in SESSIONS for turn in (1, 2)]
    second_turns = [row for row in rows if row["turn"] == 2]
    # the previous prompt at least: the billing header, developer turns, several system turns
    # and tools rendered the same way every turn
    assert all(row["cached_tokens"] >= row["prev_prompt_plus_reply"] - 8 - 1 for row in second_turns), rows
    assert set(reuse_summary(rows)) == set(SESSIONS)


def test_the_billing_header_changes_on_every_request_like_claude_codes():
    import random

    rng = random.Random(0)
    first, second = billing_header(rng), billing_header(rng)
    assert first != second and first.startswith("x-anthropic-billing-header: cc_version=2.1.36.")
