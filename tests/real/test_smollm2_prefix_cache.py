"""The prefix cache on the real trained demo:smollm2: a hit changes no reply. The same request
twice reads its prompt from the cache, and a second turn reuses the first turn's prompt and
reply, each answering exactly what mlx-lm answers on the whole prompt."""

from __future__ import annotations

import httpx
import pytest
import trio
from smollm2_helpers import TIMEOUT_S, WITH_TOKEN_IDS, assert_reply_is, chat, post_chat

pytestmark = [pytest.mark.mlx, pytest.mark.smollm2]

#: Questions no other test asks: the shared server's cache holds only their common system turn.
FIRST = "Where is the Great Wall?"
SECOND = "How long is it?"


def cached_tokens(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_a_cache_hit_keeps_the_reply_and_a_second_turn_reuses_the_first(smollm2_url, reference):
    first_turn = chat(FIRST)
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            cold = await post_chat(http, smollm2_url, first_turn, **WITH_TOKEN_IDS)
            warm = await post_chat(http, smollm2_url, first_turn, **WITH_TOKEN_IDS)
            answer = cold["choices"][0]["message"]["content"]
            second_turn = [*first_turn, {"role": "assistant", "content": answer}, {"role": "user", "content": SECOND}]
            follow_up = await post_chat(http, smollm2_url, second_turn, **WITH_TOKEN_IDS)
    expected = reference.greedy(first_turn)
    for reply in (cold, warm):
        assert_reply_is(reply["choices"][0], expected, reference.eos_token_ids)
    # the repeat found (more of) its prompt in the cache than the first request did
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert cached_tokens(cold) < cached_tokens(warm) < prompt_tokens
    # the second turn's prompt begins with the first turn's prompt and reply: at least the prompt came from the cache
    assert cached_tokens(follow_up) >= prompt_tokens
    assert_reply_is(follow_up["choices"][0], reference.greedy(second_turn), reference.eos_token_ids)
    assert follow_up["usage"]["prompt_tokens"] == len(reference.prompt_ids(second_turn))
