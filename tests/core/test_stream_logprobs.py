"""RequestStream hands each token's logprobs out with the delta of that token, even when
the token's text is held back (a split UTF-8 character, a possible stop string)."""

from __future__ import annotations

import trio

from vllm_mlx_trio.messages import Accepted, RequestId, RequestOutput, TokenLogprob
from vllm_mlx_trio.stream import RequestStream
from vllm_mlx_trio.testing.fake_executor import IM_END, FakeTokenizer

TOKENIZER = FakeTokenizer()


def entry(token_id: int) -> TokenLogprob:
    return TokenLogprob(token_id=token_id, logprob=-0.1 * token_id, top=((token_id, -0.1 * token_id),))


def output(token_ids, finish_reason=None) -> RequestOutput:
    return RequestOutput(token_ids=tuple(token_ids), finish_reason=finish_reason, logprobs=tuple(map(entry, token_ids)))


async def run(outputs, stop=()):
    send, recv = trio.open_memory_channel(len(outputs) + 1)
    send.send_nowait(Accepted(num_prompt_tokens=1, max_tokens=100))
    for item in outputs:
        send.send_nowait(item)
    with trio.fail_after(5), RequestStream(RequestId("r"), recv, TOKENIZER, stop) as stream:
        await stream.wait_accepted()
        return [delta async for delta in stream]


async def test_held_back_text_still_carries_its_logprobs():
    check = TOKENIZER.encode("✓")  # three tokens, one character
    deltas = await run([output(check[:1]), output(check[1:2]), output(check[2:]), output([IM_END], "stop")])
    assert [d.text for d in deltas] == ["", "", "✓", ""]
    expected_ids = ([check[0]], [check[1]], [check[2]], [IM_END])
    assert [d.logprobs for d in deltas] == [tuple(map(entry, ids)) for ids in expected_ids]


async def test_possible_stop_string_and_stop_keep_logprobs():
    ab, cd = TOKENIZER.encode("aX"), TOKENIZER.encode("Yb")
    deltas = await run([output(ab), output(cd)], stop=("XY",))
    assert [d.text for d in deltas] == ["a", ""]
    assert deltas[-1].finish_reason == "stop"
    # the stop string ends at Y: b, after it in the same output, is dropped with its logprob
    assert [d.logprobs for d in deltas] == [tuple(map(entry, ab)), (entry(cd[0]),)]
    assert deltas[-1].token_ids == (cd[0],)


async def test_no_logprobs_when_the_output_has_none():
    deltas = await run([RequestOutput(token_ids=tuple(TOKENIZER.encode("hi")), finish_reason="length")])
    assert deltas[0].text == "hi" and deltas[0].logprobs == ()
