"""Preemption on the architectures whose cache is not all KV (and on the pure-recurrent pair): a preempted request is
recomputed from its prompt and output, through the prefix cache's checkpoints, to the very
tokens it would have had."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker import kv_budget

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
PARAMS = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
ROW_TOKENS = 150  # a row's prompt and output, about
MAX_ROWS = 16


def config(model_dir: str, *overrides: str):
    return load_config(None, overrides=[f"model.path={model_dir}", "cache.block_size=16", *overrides], environ={})


async def run_batch(engine, rows: int, params: SamplingParams = PARAMS) -> dict[int, list]:
    """Each row's tokens, or (token, logprob) pairs when ``params`` asks for logprobs."""
    outputs: dict[int, list] = {}

    async def one(i: int) -> None:
        prompt = [{"role": "user", "content": f"Number {i}, please: tell me about the sea and the sky."}]
        if not params.logprobs:
            outputs[i] = [t async for d in engine.generate(prompt, params) for t in d.token_ids]
            return
        deltas = [d async for d in engine.generate(prompt, params)]
        tokens = [t for d in deltas for t in d.token_ids]
        logprobs = [lp.logprob for d in deltas for lp in d.logprobs]
        outputs[i] = list(zip(tokens, logprobs, strict=True))

    async with trio.open_nursery() as nursery:
        for i in range(rows):
            nursery.start_soon(one, i)
    return outputs


async def roomy_and_tight(model_dir: str, *options: str, params: SamplingParams = PARAMS) -> tuple[dict, dict, object]:
    """The batch's outputs with room for every row, then in 1 MiB (preempting), and the
    second engine's statistics."""
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(model_dir, "engine.kv_memory_mb=1", *options)) as engine:
            budget = engine.model_info.kv_budget_tokens
        rows = min(MAX_ROWS, -(-2 * budget // ROW_TOKENS))  # about twice what 1 MiB holds
        assert rows * ROW_TOKENS > budget
        async with open_engine(config(model_dir, *options)) as engine:
            roomy = await run_batch(engine, rows, params)
        async with open_engine(config(model_dir, "engine.kv_memory_mb=1", *options)) as engine:
            tight = await run_batch(engine, rows, params)
            stats = engine.statistics()
            engine._cache.check_invariants()
    return roomy, tight, stats


@pytest.mark.parametrize("arch", ["gemma3_text", "gpt_oss", "qwen3_next", "lfm2"])
async def test_preempted_requests_finish_with_the_tokens_they_would_have_had(zoo_dirs, arch):
    roomy, tight, stats = await roomy_and_tight(zoo_dirs[arch])
    assert stats.scheduler.num_preemptions > 0
    assert stats.num_requests == 0 and stats.cache.num_leased == 0
    assert tight == roomy


#: What the KV budget counts per token of a pure-recurrent model here. Its state has a fixed
#: size, so the real count is nothing per token (1 byte) and 1 MiB would never preempt; this
#: makes the scheduler's budget a few rows' worth, as for the models above.
RECURRENT_BYTES_PER_TOKEN = 1024
#: With logprobs: a tiny random mamba's greedy tokens barely depend on its state (a restored
#: state of zeros gave the same tokens), its logprobs do.
RECURRENT_PARAMS = SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True, logprobs=1)


@pytest.mark.parametrize("arch", ["mamba", "mamba2"])
async def test_a_preempted_pure_recurrent_request_finishes_with_its_tokens(recurrent_dirs, arch, monkeypatch):
    """A preempted mamba row is recomputed from prompt + output through its checkpoints (only
    at known positions: block boundaries and before the last prompt token) to the very tokens
    it would have had. The runner's own prefill, every block a snapshot: mamba (v1) ignores the
    left padding of ``BatchGenerator``'s prefill (see test_recurrent_models.py)."""
    monkeypatch.setattr(kv_budget, "kv_bytes_per_token", lambda model: RECURRENT_BYTES_PER_TOKEN)
    options = ("engine.prefill_time_ratio=1.0", "cache.state_snapshot_blocks=1")
    roomy, tight, stats = await roomy_and_tight(recurrent_dirs[arch], *options, params=RECURRENT_PARAMS)
    assert stats.scheduler.num_preemptions > 0
    assert stats.cache.pool.tokens_saved > 0
    assert stats.num_requests == 0 and stats.cache.num_leased == 0
    for i, row in roomy.items():
        assert [t for t, _ in tight[i]] == [t for t, _ in row], i
        assert [lp for _, lp in tight[i]] == pytest.approx([lp for _, lp in row], abs=1e-4), i
