"""The distributed runner's pure parts: seeds fixed by rank 0, the shape of the launch."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan
from vllm_mlx_trio.worker import distributed_runner


def _seq(name: str, seed: int | None) -> NewSequence:
    return NewSequence(request_id=RequestId(name), prompt_token_ids=(1, 2), params=SamplingParams(seed=seed))


def test_rank_0_fixes_a_seed_for_every_unseeded_sequence_and_keeps_given_ones():
    plan = StepPlan(step_id=3, new_seqs=(_seq("a", None), _seq("b", 7)), decode_ids=(RequestId("c"),))
    fixed = distributed_runner.fix_seeds(plan)
    seeds = [seq.params.seed for seq in fixed.new_seqs]
    assert seeds[0] is not None and 0 <= seeds[0] < 2**63 and seeds[1] == 7
    assert fixed.decode_ids == plan.decode_ids and fixed.step_id == 3
    seeded = StepPlan(step_id=4, new_seqs=(_seq("d", 1),))
    assert distributed_runner.fix_seeds(seeded) is seeded


class _Group:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


def test_tensor_times_pipeline_must_match_the_ranks(monkeypatch):
    monkeypatch.setattr(distributed_runner.mx.distributed, "init", lambda strict, backend: _Group(4))
    cfg = load_config(None, overrides=["engine.mode=distributed", "distributed.tensor=3"])
    with pytest.raises(ConfigError, match=r"tensor \(3\) x distributed.pipeline \(1\)"):
        distributed_runner.init_group(cfg)
    ok = load_config(None, overrides=["engine.mode=distributed", "distributed.tensor=2", "distributed.pipeline=2"])
    assert distributed_runner.init_group(ok).size() == 4
