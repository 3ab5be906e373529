"""The distributed runner's parts that need no second rank: seeds fixed by rank 0, the shape of
the launch, the collective watchdog (with its exit replaced)."""

from __future__ import annotations

import threading
import time

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


def _watchdog(timeout_s: float) -> tuple[distributed_runner.CollectiveWatchdog, list[str], threading.Event]:
    """A watchdog that records the expired section instead of exiting the process."""
    expired: list[str] = []
    fired = threading.Event()

    def on_expire(what: str) -> None:
        expired.append(what)
        fired.set()

    return distributed_runner.CollectiveWatchdog(timeout_s, rank=0, on_expire=on_expire), expired, fired


def test_the_collective_watchdog_fires_at_the_deadline_not_at_a_polling_tick():
    watchdog, expired, fired = _watchdog(0.02)
    started = time.monotonic()
    with watchdog.guard("step 7"):
        assert fired.wait(timeout=10)
    waited = time.monotonic() - started
    assert expired == ["step 7"]
    assert waited < 0.4, waited  # woken by its deadline, not by a sleep loop's next look
    watchdog.close()


def test_a_section_that_ends_in_time_wakes_the_watchdog_and_is_not_fired():
    watchdog, expired, fired = _watchdog(0.2)
    for step in range(20):
        with watchdog.guard(f"step {step}"):
            pass
    watchdog.close()
    watchdog._thread.join(timeout=10)
    assert not watchdog._thread.is_alive()  # closing ends its wait at once
    assert expired == [] and not fired.is_set()
