"""Prove that a cancelled request frees what it held, deterministically: a pytest-trio test.

    pytest examples/test_cancellation.py

The engine runs its real actors (admission, scheduler, cache manager) on a pure-Trio
``FakeExecutor`` instead of the MLX thread. A ``StepGate`` holds every model step until the
test allows it, and ``autojump_clock`` makes the fake's compute time free, so the test knows
exactly which step is in flight when it cancels. See docs/testing-cancellation.md.

The last test does the same on the real demo model (it builds demo:tiny on first use, into
``$VLLM_MLX_TRIO_CACHE_DIR/demo`` or ``~/.cache/vllm-mlx-trio/demo``): there the steps are
not gated, so it records the plans the real runner executes and bounds how many more steps
the model ran for the request once it was cancelled.

The repository's pytest configuration sets ``trio_mode = true``; the marker below makes the
file work in a project without it too.
"""

from __future__ import annotations

import threading

import pytest
import trio
import trio.testing

from vllm_mlx_trio import SamplingParams, load_config, open_engine
from vllm_mlx_trio.testing.fake_executor import StepGate, text_script
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.worker.registry import runner_class

pytestmark = pytest.mark.trio

CHAT = [{"role": "user", "content": "Tell me a long story."}]


async def step(gate: StepGate, num_steps: int = 1) -> None:
    """Let ``num_steps`` model steps run, then wait until every task is blocked again."""
    gate.allow(num_steps)
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_cancel_scope_frees_the_request_within_one_step(autojump_clock, mode):
    gate = StepGate()
    with trio.fail_after(10):  # virtual seconds: autojump_clock makes them instant
        async with open_fake_engine(
            overrides=(f"engine.mode={mode}",),
            script=text_script("once upon a time ", then_eos=False),  # never ends by itself
            gate=gate,
            step_s=0,
        ) as fake:
            engine, executor = fake.engine, fake.executor
            seen: dict[str, object] = {}

            async def consume(scope: trio.CancelScope, first_delta: trio.Event) -> None:
                with scope:  # the cancel scope around the loop is what aborts the request
                    stream = await engine.submit(CHAT, SamplingParams(max_tokens=1000))
                    seen["id"] = stream.request_id
                    with stream:
                        async for _delta in stream:
                            first_delta.set()

            async with trio.open_nursery() as nursery:
                scope, first_delta = trio.CancelScope(), trio.Event()
                nursery.start_soon(consume, scope, first_delta)
                while not first_delta.is_set():  # run steps until the first token arrived
                    await step(gate)
                request_id = seen["id"]
                assert request_id in engine.statistics().scheduler.running_ids
                scope.cancel()  # mid-stream: the request is running and wants 1000 tokens
            assert scope.cancelled_caught

            # The stream is closed: the request's engine slot is already back. The scheduler
            # is waiting for the step in flight, so the request is still in its batch.
            assert engine.statistics().num_requests == 0
            assert request_id in engine.statistics().scheduler.running_ids
            plans_before = len(executor.plans)

            # One step: the one in flight when we cancelled ends, and the scheduler drops the
            # request from the batch and releases its prefix-cache leases.
            await step(gate)
            stats = engine.statistics()
            assert request_id not in stats.scheduler.running_ids
            assert stats.scheduler.num_running == 0 and stats.scheduler.num_aborted == 1
            assert stats.num_requests == 0
            assert stats.cache.num_leased == 0

            # The next plan the scheduler builds names it in finished_ids, so the executor drops
            # its state. Simple mode has one plan in flight: that is the very next step. Batched
            # mode has two: the plan after the one already sent (which still decodes the
            # request; its token is dropped).
            await step(gate, runner_class(mode).plans_in_flight)
            after = executor.plans[plans_before:]  # the step in flight, then these
            assert len(after) == 1 + runner_class(mode).plans_in_flight
            assert not any(request_id in p.finished_ids for p in after[:-1])
            assert request_id in after[-1].finished_ids
            assert request_id not in after[-1].decode_ids
            assert executor.sequences == {}

            # Every step ran on the Trio thread: the fake never leaves it.
            assert len(executor.thread_ids) == 1
            gate.allow(100)  # let the engine drain when the block is left


async def test_request_cancelled_while_queued_never_reaches_the_model(autojump_clock):
    gate = StepGate()
    with trio.fail_after(10):
        async with open_fake_engine(
            overrides=("engine.mode=simple",), script=text_script("ab"), gate=gate, step_s=0
        ) as fake:
            first = await fake.engine.submit(CHAT)  # takes the only running slot
            with first:
                with trio.move_on_after(1) as scope:  # a timeout is a cancel scope too
                    async with fake.engine.open_request("queued") as queued:
                        queued_id = queued.request_id
                        async for _delta in queued:
                            pass
                assert scope.cancelled_caught
                assert fake.engine.statistics().num_requests == 1
                await step(gate)  # the scheduler looks at its queue after each step
                assert queued_id not in fake.engine.statistics().scheduler.waiting_ids
                gate.allow(100)
                text = "".join([d.text async for d in first])
    assert text == "ab"
    assert all(s.request_id != queued_id for p in fake.executor.plans for s in p.new_seqs)
    assert fake.engine.statistics().scheduler.num_aborted == 1


@pytest.mark.mlx
@pytest.mark.parametrize("mode", ["simple", "batched"])
async def test_real_model_drops_a_cancelled_request_after_the_steps_in_flight(mode, monkeypatch):
    from vllm_mlx_trio.worker.batched.runner import BatchRunner
    from vllm_mlx_trio.worker.simple_runner import SimpleRunner

    # Record every plan the real runner executes, and the thread it runs on.
    runner = SimpleRunner if mode == "simple" else BatchRunner
    plans, threads = [], set()
    dropped = trio.Event()  # set (from the model thread) by the plan that drops "cancel-me"
    trio_token = trio.lowlevel.current_trio_token()
    execute = runner.execute

    def recording_execute(self, plan):
        threads.add(threading.current_thread().name)
        plans.append(plan)
        if "cancel-me" in plan.finished_ids:
            trio_token.run_sync_soon(dropped.set)
        return execute(self, plan)

    monkeypatch.setattr(runner, "execute", recording_execute)
    # Built-in defaults (demo:tiny) plus the environment, e.g. VLLM_MLX_TRIO_MODEL_DEMO_CACHE_DIR.
    cfg = load_config(None, overrides=(f"engine.mode={mode}",))
    with trio.fail_after(60):
        async with open_engine(cfg) as engine:
            received = 0
            with trio.CancelScope() as scope:
                # ignore_eos and no max_tokens: it would run to the end of the context.
                params = SamplingParams(ignore_eos=True)
                async for _delta in engine.generate(CHAT, params, request_id="cancel-me"):
                    received += 1
                    if received == 3:
                        scope.cancel()  # the loop's next await raises Cancelled
            assert scope.cancelled_caught
            # The stream is closed now: steps the scheduler has handled since the client left.
            steps_at_cancel = engine.statistics().scheduler.num_steps
            assert engine.statistics().num_requests == 0  # the slot is back at once

            # The model thread is not gated: wait for the plan that drops it.
            await dropped.wait()
            stats = engine.statistics()
            assert "cancel-me" not in stats.scheduler.running_ids
            assert stats.scheduler.num_aborted == 1 and stats.cache.num_leased == 0

            # The drop came with the first plan built after the steps already in flight, and
            # no plan from there on computes a token for it.
            drop = next(i for i, p in enumerate(plans) if "cancel-me" in p.finished_ids)
            assert drop <= steps_at_cancel + runner_class(mode).plans_in_flight
            assert not any("cancel-me" in p.decode_ids for p in plans[drop:])
            assert threads == {"mlx-executor"}  # every step ran on the engine's one MLX thread

            # ...and the engine serves the next request as usual.
            params = SamplingParams(max_tokens=4, ignore_eos=True)
            deltas = [d async for d in engine.generate(CHAT, params)]
            assert deltas[-1].finish_reason == "length"
