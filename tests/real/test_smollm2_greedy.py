"""Greedy decoding on the real trained demo:smollm2: the server's replies are mlx-lm's own, token
for token, alone and sharing the batch; they end on EOS or at max_tokens, stop strings cut them,
and their logprobs are the model's."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from smollm2_helpers import (
    CHAT_ROUTE,
    FRANCE,
    GENERATED,
    MAX_TOKENS,
    PARIS,
    QUESTIONS,
    STEPS,
    TIMEOUT_S,
    WITH_TOKEN_IDS,
    assert_reply_is,
    body,
    chat,
    counters,
    post_chat,
    reply_token_ids,
    token_id,
)

pytestmark = [pytest.mark.mlx, pytest.mark.smollm2]

#: How close the server's logprobs are to a direct forward pass (float32; the server decodes
#: with a KV cache, the reference runs the whole sequence at once).
LOGPROB_TOLERANCE = 1e-3


async def test_greedy_replies_are_mlx_lm_generate_alone_and_batched(smollm2_url, reference):
    chats = [chat(question) for question in QUESTIONS]
    expected = [reference.greedy(messages) for messages in chats]
    assert PARIS in expected[0].text  # the model is the trained one
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            alone = [await post_chat(http, smollm2_url, messages, **WITH_TOKEN_IDS) for messages in chats]
            batched: dict[int, dict] = {}
            before = await counters(http, smollm2_url)

            async def ask(index, messages):
                batched[index] = await post_chat(http, smollm2_url, messages, **WITH_TOKEN_IDS)

            async with trio.open_nursery() as nursery:  # twice each: six rows share the batch
                for index, messages in enumerate([*chats, *chats]):
                    nursery.start_soon(ask, index, messages)
            after = await counters(http, smollm2_url)
    # the rows shared the model's steps (one at a time, each token would take a step of its own)
    generated, steps = after[GENERATED] - before[GENERATED], after[STEPS] - before[STEPS]
    assert steps < generated / 2, (steps, generated)
    for index, want in enumerate(expected):
        assert_reply_is(alone[index]["choices"][0], want, reference.eos_token_ids)
        assert_reply_is(batched[index]["choices"][0], want, reference.eos_token_ids)
        assert_reply_is(batched[index + len(chats)]["choices"][0], want, reference.eos_token_ids)
    assert PARIS in alone[0]["choices"][0]["message"]["content"]


async def test_a_reply_ends_on_eos_with_stop_and_max_tokens_cuts_it_with_length(smollm2_url, reference):
    expected = reference.greedy(chat(FRANCE))
    assert expected.finish_reason == "stop"
    cut_at = len(expected.token_ids) // 2
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            whole = await post_chat(http, smollm2_url, chat(FRANCE), max_tokens=MAX_TOKENS)
            cut = await post_chat(http, smollm2_url, chat(FRANCE), max_tokens=cut_at, **WITH_TOKEN_IDS)
    choice, usage = whole["choices"][0], whole["usage"]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == expected.text
    assert usage["completion_tokens"] < MAX_TOKENS
    assert "<|im_end|>" not in choice["message"]["content"]
    assert cut["choices"][0]["finish_reason"] == "length"
    assert cut["usage"]["completion_tokens"] == cut_at
    assert reply_token_ids(cut["choices"][0]) == list(expected.token_ids[:cut_at])
    assert cut["choices"][0]["message"]["content"] == reference.tokenizer.decode(list(expected.token_ids[:cut_at]))


async def test_a_stop_string_cuts_the_reply_before_it(smollm2_url, reference):
    expected = reference.greedy(chat(FRANCE)).text
    assert PARIS in expected
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            whole = await post_chat(http, smollm2_url, chat(FRANCE), stop=[PARIS])
            streaming = body(chat(FRANCE), stop=[PARIS], stream=True)
            async with http.stream("POST", f"{smollm2_url}{CHAT_ROUTE}", json=streaming) as resp:
                assert resp.status_code == 200
                lines = [line async for line in resp.aiter_lines() if line.startswith("data: {")]
    cut = expected[: expected.index(PARIS)]
    assert whole["choices"][0]["message"]["content"] == cut
    assert whole["choices"][0]["finish_reason"] == "stop"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert streamed == cut and finishes == ["stop"]


async def test_logprobs_are_the_models_log_softmax(smollm2_url, reference):
    messages = chat(FRANCE)
    with trio.fail_after(TIMEOUT_S):
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            reply = await post_chat(http, smollm2_url, messages, top_logprobs=3, **WITH_TOKEN_IDS)
    prompt_ids = reference.prompt_ids(messages)
    assert reply["usage"]["prompt_tokens"] == len(prompt_ids)
    entries = reply["choices"][0]["logprobs"]["content"]
    output_ids = reply_token_ids(reply["choices"][0])
    logprobs = reference.logprobs(prompt_ids, output_ids).tolist()
    assert output_ids[-1] in reference.eos_token_ids  # the EOS it stopped on has its logprob too
    for position, (entry, chosen, row) in enumerate(zip(entries, output_ids, logprobs, strict=True)):
        top = [(token_id(t["token"]), t["logprob"]) for t in entry["top_logprobs"]]
        assert len(top) == 3
        assert top[0][0] == chosen, position  # greedy: the chosen token is the most likely one
        assert entry["logprob"] == pytest.approx(row[chosen], abs=LOGPROB_TOLERANCE), position
        for token, logprob in top:
            assert logprob == pytest.approx(row[token], abs=LOGPROB_TOLERANCE), (position, token)
        # the three most likely tokens, in order (compared by value: near-ties may swap ids)
        best = sorted(row, reverse=True)[:3]
        assert [logprob for _, logprob in top] == pytest.approx(best, abs=LOGPROB_TOLERANCE), position
