"""The engine's health has one owner: it changes only by reports, and everyone else reads a
frozen snapshot (or waits for the failure)."""

from __future__ import annotations

import attrs
import pytest
import trio
import trio.testing

from vllm_mlx_trio.errors import EngineStalledError, ExecutorCrashedError
from vllm_mlx_trio.health import DrainStarted, EngineFailed, EngineHealth, HealthSnapshot
from vllm_mlx_trio.testing.harness import open_fake_engine


async def test_the_first_failure_reported_is_the_cause_and_waiters_wake_with_it():
    health = EngineHealth()
    cause, consequence = ExecutorCrashedError("step 3 failed"), EngineStalledError("stuck")
    woken: list[BaseException] = []
    before = health.snapshot()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def wait() -> None:
                woken.append(await health.wait_failed())

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not woken
            health.report(EngineFailed(error=cause))
            health.report(EngineFailed(error=consequence))
        assert await health.wait_failed() is cause  # at once, once failed
    assert before == HealthSnapshot() and before.ok and before.status == "ok"
    assert woken == [cause]
    assert health.snapshot() == HealthSnapshot(error=cause) and health.snapshot().status == "failed"


def test_a_drain_is_a_report_and_a_failure_outranks_it_in_the_status():
    health = EngineHealth()
    health.report(DrainStarted())
    draining = health.snapshot()
    health.report(EngineFailed(error=EngineStalledError("stuck")))
    assert (draining.draining, draining.ok, draining.status) == (True, True, "draining")
    assert health.snapshot().draining and health.snapshot().status == "failed"


async def test_the_engine_shows_only_snapshots_of_its_health(autojump_clock):
    with trio.fail_after(10):
        async with open_fake_engine() as fake:
            engine = fake.engine
            before = engine.health
            engine.start_draining()
            after, draining = engine.health, engine.draining
            with pytest.raises(attrs.exceptions.FrozenInstanceError):
                after.draining = False  # type: ignore[misc]
            with pytest.raises(AttributeError):
                engine.draining = False  # type: ignore[misc]
    assert isinstance(before, HealthSnapshot) and not before.draining  # a snapshot: it does not change
    assert after.draining and draining and after.ok
