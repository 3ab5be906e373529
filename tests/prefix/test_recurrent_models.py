"""Pure-recurrent models (mamba, mamba2: every layer an SSM state, no attention layer) with the
prefix cache on give exactly the cache-off greedy output in both modes, and reuse cached
prompts. Their cache cannot tell how many tokens it has seen, so it is checkpointed only where
the position is known: the block boundaries its prefill stops at (``cache.state_snapshot_blocks``)
and before the last prompt token, where the runner says the cache stands (see
docs/architecture.md). Batched mode
runs both prefill paths: the runner's own and mlx-lm's ``BatchGenerator`` segments. Preemption:
tests/prefix/test_preemption_every_layer_type.py."""

from __future__ import annotations

import logging

import pytest
import trio
from prefix_zoo import RECURRENT
from test_every_layer_type import BS, config, scenario

from vllm_mlx_trio import open_engine

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120


REPEATS = ("repeat", "unaligned_repeat", "short_repeat", "aligned_repeat", *(f"batch_repeat_{i}" for i in range(3)))


PREFILL = {"batched": "engine.prefill_time_ratio=1.0", "batched-generator": "engine.prefill_time_ratio=none"}


#: Not mamba (v1) through ``BatchGenerator``'s own prefill: mlx-lm's mamba ignores left padding
#: in a batched prefill, so with the cache off a prompt prefilled beside longer ones already gets
#: other logprobs than alone (seen: -0.189 against -0.099 for its first token), and cache on and
#: off cannot be compared there. mamba is covered in the other two modes, mamba2 in all three.
CASES = [
    (arch, mode)
    for arch in sorted(RECURRENT)
    for mode in ("batched", "batched-generator", "simple")
    if (arch, mode) != ("mamba", "batched-generator")
]


@pytest.mark.parametrize(("arch", "mode"), CASES)
async def test_a_pure_recurrent_model_is_cached_and_exact(recurrent_dirs, arch, mode, caplog):
    """The eight architectures' scenario (repeats, a shared system prompt, a second turn,
    aligned and unaligned prompts, a batch): cache-on output equals cache-off."""
    options = [PREFILL.get(mode, "engine.prefill_time_ratio=1.0"), "cache.state_snapshot_blocks=1"]  # every block
    engine_mode = mode.removesuffix("-generator")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(config(recurrent_dirs[arch], engine_mode, "cache.enabled=false", *options)) as engine:
            off = await scenario(engine)
        with caplog.at_level(logging.WARNING):
            async with open_engine(config(recurrent_dirs[arch], engine_mode, *options)) as engine:
                on = await scenario(engine)
                engine._cache.check_invariants()
    for key in off:
        assert on[key].tokens == off[key].tokens, key
        assert on[key].logprobs == pytest.approx(off[key].logprobs, abs=1e-4), key
    assert not [r for r in caplog.records if "prefix cache off" in r.getMessage()]
    assert on["first"].cached_tokens == 0
    for key in REPEATS:
        prompt = on[key].prompt_tokens
        # checkpointed where the runner says the cache stands, before the last prompt token
        assert on[key].cached_tokens == prompt - 1, key
    assert on["repeat"].cached_tokens > 0
    # a shared system prompt: up to the last boundary the prompts share
    assert on["shared_system"].cached_tokens > 0 and on["shared_system"].cached_tokens % BS == 0
    # a second turn: its first turn's prompt (simple mode: up to that prompt's checkpoint)
    first = on["first"].prompt_tokens
    assert on["turn2"].cached_tokens >= first - 1
