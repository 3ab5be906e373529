"""``cache.kv_bits``: stored full blocks are kept quantized and restored on a hit."""

from __future__ import annotations

import mlx.core as mx
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.polling import wait_until
from vllm_mlx_trio.worker.prefix.layers import Packed

pytestmark = pytest.mark.mlx

TIMEOUT_S = 60
PARAMS = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=1)
PROMPT = [
    {"role": "system", "content": "You answer in one short line about the sea and the stars. " * 6},
    {"role": "user", "content": "What is the sea?"},
]


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_round_trip_is_close_and_smaller(bits):
    block = mx.random.normal((1, 2, 16, 16))  # a head of 16 values: groups run across tokens
    packed = Packed.of(block, group_size=64, bits=bits)
    assert packed.unpack().shape == block.shape and packed.unpack().dtype == block.dtype
    error = mx.abs(packed.unpack() - block).max().item()
    assert error < (0.1 if bits == 8 else 0.8)
    assert packed.nbytes < block.nbytes / (2 if bits == 8 else 4)


async def run(engine) -> tuple[list[int], list[float], int]:
    with await engine.submit(PROMPT, PARAMS) as stream:
        tokens, logprobs = [], []
        async for delta in stream:
            tokens.extend(delta.token_ids)
            logprobs.extend(lp.logprob for lp in delta.logprobs)
    return tokens, logprobs, stream.usage.cached_tokens


@pytest.mark.parametrize("mode", ["batched", "simple"])
async def test_quantized_blocks_are_smaller_and_a_hit_restores_them(float32_dir, mode):
    results = {}
    with trio.fail_after(TIMEOUT_S):
        for bits in (None, 8, 4):
            overrides = [f"model.path={float32_dir}", f"engine.mode={mode}", "cache.block_size=16"]
            overrides += [f"cache.kv_bits={bits}"] if bits else []
            async with open_engine(load_config(None, overrides=overrides, environ={})) as engine:
                first = await run(engine)
                again = await run(engine)
                await wait_until(lambda: engine.statistics().cache.num_leased == 0, poll_s=0.005)
                blocks = [b for b in engine.prefix_blocks() if not b.is_tail and not b.ref_count]
                results[bits] = (first, again, sum(b.nbytes for b in blocks) / len(blocks))
    (plain, plain_again, _), (q8, q8_again, _) = results[None], results[8]
    assert plain_again[2] == q8_again[2] == results[4][1][2] > 0  # every repeat hits all but one token
    assert q8[0] == plain[0] and q8_again[0] == plain[0]  # 8 bits: the same greedy tokens
    assert max(abs(a - b) for a, b in zip(q8_again[1], plain_again[1], strict=True)) < 0.05
    assert len(results[4][1][0]) == PARAMS.max_tokens
    # a block's bytes as the pool counts them: float32 -> 8 bits (+ scales) -> 4 bits
    assert results[None][2] > 2 * results[8][2] > 2 * results[4][2] * 0.9
