"""``vllm:kv_cache_usage_perc`` means what it means in vLLM (the running requests' KV over
the KV they may hold); the prefix cache's fill has its own gauge."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from vllm_mlx_trio.actors.scheduler.stats import SchedulerStatistics
from vllm_mlx_trio.core.prefix.block_pool import PoolStats
from vllm_mlx_trio.metrics import engine_snapshot
from vllm_mlx_trio.testing.fake_executor import StepGate
from vllm_mlx_trio.testing.harness import open_fake_engine

KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_USAGE = "vllm_mlx_trio_prefix_cache_usage_perc"
#: The fake executor's context length (its default).
FAKE_CONTEXT = 4096


def gauge(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} is not exported")


async def usage_with_two_running(**fake_kwargs) -> tuple[float, float, int, int | None]:
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(overrides=("engine.max_num_seqs=4",), gate=gate, step_s=0, **fake_kwargs) as fake:
            streams = [await fake.engine.submit([{"role": "user", "content": f"q{i}"}]) for i in range(2)]
            gate.allow(3)  # both requests are in the batch by the third step, whenever each arrived
            await trio.testing.wait_all_tasks_blocked()  # the three steps ran; the gate holds the fourth
            stats = fake.engine.statistics().scheduler
            text = fake.engine.metrics.render().decode()
            for stream in streams:
                stream.close()
            gate.allow(100)
    assert stats.num_running == 2 and stats.kv_tokens_held > 0
    return gauge(text, KV_USAGE), gauge(text, PREFIX_USAGE), stats.kv_tokens_held, stats.kv_budget_tokens


async def test_kv_usage_is_the_running_kv_over_the_budget(autojump_clock):
    kv_usage, prefix_usage, held, budget = await usage_with_two_running(kv_budget_tokens=1000)
    assert budget == 1000
    assert kv_usage == pytest.approx(held / 1000)
    assert prefix_usage == 0.0  # the fake computes no KV, so nothing is cached


async def test_without_a_budget_the_context_length_bounds_the_running_kv(autojump_clock):
    kv_usage, _, held, budget = await usage_with_two_running()
    assert budget is None
    assert kv_usage == pytest.approx(held / (4 * FAKE_CONTEXT))


def pool(**fields) -> PoolStats:
    zero = dict.fromkeys(attrs.fields_dict(PoolStats), 0)
    return PoolStats(**{**zero, "max_bytes": None, "max_blocks": None, "over_budget": False, **fields})


@attrs.frozen
class Cache:
    pool: PoolStats


def scheduler(**fields) -> SchedulerStatistics:
    base = dict(
        num_waiting=0, num_running=1, num_steps=0, num_finished=0, num_aborted=0, running_ids=(), waiting_ids=()
    )
    return SchedulerStatistics(**{**base, **fields})


def test_both_gauges_stay_within_0_and_1():
    values = engine_snapshot(
        scheduler(kv_tokens_held=1500), Cache(pool(bytes_used=30, max_bytes=20)), kv_capacity_tokens=1000
    )
    assert (values["kv_cache_usage"], values["prefix_cache_usage"]) == (1.0, 1.0)
    values = engine_snapshot(
        scheduler(kv_tokens_held=250), Cache(pool(num_blocks=3, max_blocks=12)), kv_capacity_tokens=1000
    )
    assert (values["kv_cache_usage"], values["prefix_cache_usage"]) == (0.25, 0.25)
    assert engine_snapshot(scheduler(), Cache(pool()), kv_capacity_tokens=0)["kv_cache_usage"] == 0.0
