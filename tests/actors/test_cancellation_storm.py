"""Cancellation at random points, and storms of it, on the FakeExecutor under autojump_clock.

Every way a client can give up (break, a deadline, an exception in its loop body, a cancel
scope) must abort its request exactly once, free everything it held, never swallow the
``trio.Cancelled`` that ended it, and leave the other requests' outputs untouched.
"""

from __future__ import annotations

import contextlib
import random
import types
from collections import Counter
from dataclasses import dataclass, field

import pytest
import trio

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.core.request import RequestStatus
from vllm_mlx_trio.core.scheduler import Scheduler
from vllm_mlx_trio.messages import RequestId, StepResult
from vllm_mlx_trio.testing.fake_executor import FakeTokenizer, letters_script
from vllm_mlx_trio.testing.harness import open_fake_engine
from vllm_mlx_trio.testing.requests import chat, make_request

STEP_S = 0.01
MAX_TOKENS = 40
CANCEL_MODES = ("break", "move_on", "raise", "scope")


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "storm prompt number {}"


class ConsumerGaveUp(Exception):
    """Raised by a consumer in its loop body."""


@dataclass
class Outcome:
    mode: str
    arg: float
    text: str = ""
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: object = None
    cancelled_caught: bool | None = None
    ran_past_cancel: bool = False  # code after the cancellation point ran (Cancelled swallowed)
    deltas: int = 0
    extra: dict = field(default_factory=dict)

    def add(self, delta) -> None:
        self.deltas += 1
        self.text += delta.text
        self.token_ids += delta.token_ids


def count_tasks() -> int:
    """Every task alive in this run, found from the root task down."""

    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(child) for nursery in task.child_nurseries for child in nursery.child_tasks)

    return walk(trio.lowlevel.current_root_task())


def success_count(engine, reason: str) -> float:
    value = engine.metrics.registry.get_sample_value(
        "vllm:request_success_total", {"model_name": engine.cfg.model_name, "finished_reason": reason, "endpoint": ""}
    )
    return value or 0.0


async def consume(engine, i: int, out: Outcome) -> None:
    """Run request ``i`` the way ``out.mode`` says, recording what the client saw."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0)
    rid = f"r{i}"
    if out.mode == "full":
        stream = await engine.submit(chat(QUESTION.format(i)), params, request_id=rid)
        with stream:
            async for delta in stream:
                out.add(delta)
        out.finish_reason, out.usage = stream.finish_reason, stream.usage
    elif out.mode == "break":  # the public async generator, closed promptly by aclosing
        async with contextlib.aclosing(engine.generate(chat(QUESTION.format(i)), params, request_id=rid)) as deltas:
            async for delta in deltas:
                out.add(delta)
                assert delta.finish_reason is None
                if out.deltas == out.arg:
                    break
    elif out.mode == "move_on":  # a deadline while blocked waiting for the next delta
        stream = await engine.submit(chat(QUESTION.format(i)), params, request_id=rid)
        with stream:
            with trio.move_on_after(out.arg) as scope:
                async for delta in stream:
                    out.add(delta)
                out.ran_past_cancel = True
            out.cancelled_caught = scope.cancelled_caught
            out.finish_reason = stream.finish_reason
    elif out.mode == "raise":  # an exception in the loop body of open_request
        with pytest.raises(ConsumerGaveUp) as raised:
            async with engine.open_request(chat(QUESTION.format(i)), params, request_id=rid) as stream:
                async for delta in stream:
                    out.add(delta)
                    if out.deltas == out.arg:
                        raise ConsumerGaveUp(rid)
        out.extra["raised"] = type(raised.value)  # not wrapped in a group, not swallowed
        out.finish_reason = stream.finish_reason
    elif out.mode == "scope":  # the consumer cancels its own scope mid-iteration
        with trio.CancelScope() as scope:
            async with contextlib.aclosing(engine.generate(chat(QUESTION.format(i)), params, request_id=rid)) as deltas:
                async for delta in deltas:
                    out.add(delta)
                    if out.deltas == out.arg:
                        scope.cancel()
                out.ran_past_cancel = True
        out.cancelled_caught = scope.cancelled_caught
    else:
        raise AssertionError(out.mode)


def storm_plan(rng: random.Random, n: int = 8) -> list[Outcome]:
    """n requests: each cancel mode at least once, the rest split between modes and survivors."""
    modes = [*CANCEL_MODES, rng.choice(CANCEL_MODES), "full", "full", "full"]
    rng.shuffle(modes)
    plan = []
    for mode in modes[:n]:
        if mode == "move_on":  # from before the first token to well before the last
            arg = rng.choice([0.0005, rng.uniform(0.001, 0.25)])
        elif mode == "full":
            arg = 0
        else:
            arg = rng.randint(1, 10)
        plan.append(Outcome(mode, arg))
    return plan


async def run_all(engine, plan: list[Outcome]) -> None:
    async with trio.open_nursery() as nursery:
        for i, out in enumerate(plan):
            nursery.start_soon(consume, engine, i, out)


@pytest.mark.parametrize("mode", ["batched", "simple"])
@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_cancellations_leave_no_trace(autojump_clock, mode, seed):
    overrides = (f"engine.mode={mode}",)
    plan = storm_plan(random.Random(seed))
    baseline = [Outcome("full", 0) for _ in plan]
    with trio.fail_after(60):
        async with open_fake_engine(overrides=overrides, script=letters_script, step_s=STEP_S) as quiet:
            await run_all(quiet.engine, baseline)

        tasks_before = count_tasks()
        async with open_fake_engine(overrides=overrides, script=letters_script, step_s=STEP_S) as fake:
            await run_all(fake.engine, plan)
            await trio.sleep(1)  # a few idle steps' worth: the last drops reach the executor
            stats = fake.engine.statistics()
            sequences = dict(fake.executor.sequences)
            aborts, lengths = success_count(fake.engine, "abort"), success_count(fake.engine, "length")
        tasks_after = count_tasks()

    cancelled = [i for i, out in enumerate(plan) if out.mode != "full"]
    survivors = [i for i, out in enumerate(plan) if out.mode == "full"]
    # no task leaked; the engine holds nothing
    assert tasks_after == tasks_before
    assert stats.num_requests == 0
    assert stats.scheduler.running_ids == () and stats.scheduler.waiting_ids == ()
    assert stats.scheduler.num_running == 0 and stats.scheduler.num_waiting == 0
    assert stats.cache.num_leased == 0
    assert sequences == {}
    # each cancelled request aborted exactly once, each survivor finished once
    assert stats.scheduler.num_aborted == len(cancelled)
    assert stats.scheduler.num_finished == len(survivors)
    assert (aborts, lengths) == (len(cancelled), len(survivors))
    plans = fake.executor.plans
    started = Counter(s.request_id for p in plans for s in p.new_seqs)
    dropped = Counter(rid for p in plans for rid in p.finished_ids)
    assert all(n == 1 for n in started.values()) and all(n == 1 for n in dropped.values())
    assert set(dropped) == set(started)  # whatever reached the model was dropped, once
    assert stats.cache.num_releases == len(started)
    assert {f"r{i}" for i in survivors} <= set(started)
    # Cancelled was never swallowed, the consumer's exception never converted
    for i in cancelled:
        out = plan[i]
        assert out.finish_reason is None, (i, out)
        assert not out.ran_past_cancel, (i, out)
        if out.mode in ("move_on", "scope"):
            assert out.cancelled_caught is True, (i, out)
        if out.mode == "raise":
            assert out.extra["raised"] is ConsumerGaveUp
        if out.mode in ("break", "raise", "scope"):
            assert out.deltas == out.arg
        # what the client saw before giving up is a prefix of the uncancelled output
        assert baseline[i].token_ids[: len(out.token_ids)] == out.token_ids
        assert baseline[i].text.startswith(out.text)
    # the survivors are unaffected: same tokens, text, finish and usage as without cancellations
    for i in survivors:
        got, want = plan[i], baseline[i]
        assert (got.text, got.token_ids, got.finish_reason, got.usage) == (
            want.text,
            want.token_ids,
            want.finish_reason,
            want.usage,
        )
        assert got.finish_reason == "length" and len(got.token_ids) == MAX_TOKENS
    assert len({out.text for out in baseline}) == len(baseline)  # outputs differ per prompt
    # every plan ran on the executor's one task/thread
    assert len(fake.executor.thread_ids) == 1 and len(quiet.executor.thread_ids) == 1


async def test_cancellation_storm_then_a_fresh_request_runs_promptly(autojump_clock):
    rng = random.Random(50)
    num_storm = 50
    caught: list[bool] = []
    fresh: dict = {}
    with trio.fail_after(60):
        async with open_fake_engine(
            overrides=("engine.max_num_seqs=16",), script=letters_script, step_s=STEP_S
        ) as fake:
            engine = fake.engine

            async def give_up(i: int) -> None:
                stream = await engine.submit(
                    chat(QUESTION.format(i)), SamplingParams(max_tokens=2000), request_id=f"s{i}"
                )
                with stream, trio.move_on_after(rng.uniform(0.005, 0.3)) as scope:
                    async for _delta in stream:
                        pass
                caught.append(scope.cancelled_caught)
                assert stream.finish_reason is None

            async with trio.open_nursery() as nursery:
                for i in range(num_storm):
                    nursery.start_soon(give_up, i)
            storm_stats = engine.statistics()

            plans_before = len(fake.executor.plans)
            started_at = trio.current_time()
            stream = await engine.submit(
                chat(QUESTION.format(999)), SamplingParams(max_tokens=5, temperature=0), request_id="fresh"
            )
            with stream:
                fresh["tokens"] = tuple([t async for d in stream for t in d.token_ids])
            fresh["elapsed"] = trio.current_time() - started_at
            fresh["plans"] = len(fake.executor.plans) - plans_before
            fresh["reason"] = stream.finish_reason
            await trio.sleep(10 * STEP_S)  # the next plans drop whatever is left
            stats = engine.statistics()
            sequences = dict(fake.executor.sequences)
            late_plans = fake.executor.plans[plans_before:]

    assert caught == [True] * num_storm
    # the fresh request ran within a few steps and saw no trace of the storm
    tokenizer = FakeTokenizer()
    prompt = tokenizer.encode(tokenizer.apply_chat_template(chat(QUESTION.format(999))))
    seq = types.SimpleNamespace(prompt_token_ids=prompt)
    assert fresh["tokens"] == tuple(letters_script(seq, k) for k in range(5))
    assert fresh["reason"] == "length"
    assert fresh["plans"] <= 5 + 3, fresh
    assert fresh["elapsed"] <= (5 + 3) * STEP_S + 1e-9, fresh
    storm_ids = {f"s{i}" for i in range(num_storm)}
    fresh_plans = [p for p in late_plans if any(s.request_id == "fresh" for s in p.new_seqs)]
    assert len(fresh_plans) == 1
    after_fresh = late_plans[late_plans.index(fresh_plans[0]) + 1 :]
    assert not any(set(p.decode_ids) & storm_ids for p in after_fresh)
    assert not any(s.request_id in storm_ids for p in late_plans for s in p.new_seqs)
    # the engine holds no state for the 50
    assert stats.num_requests == 0
    assert stats.scheduler.running_ids == () and stats.scheduler.waiting_ids == ()
    assert stats.scheduler.num_aborted == num_storm and stats.scheduler.num_finished == 1
    assert stats.cache.num_leased == 0
    assert sequences == {}
    plans = fake.executor.plans
    started = Counter(s.request_id for p in plans for s in p.new_seqs)
    dropped = Counter(rid for p in plans for rid in p.finished_ids)
    assert set(started) == set(dropped) and set(started.values()) == {1} and set(dropped.values()) == {1}
    assert 16 <= len(started) - 1 < num_storm  # the queue was used: some left before they ran
    assert storm_stats.num_requests == 0  # every slot was back as soon as the clients left
    assert len(fake.executor.thread_ids) == 1


# -- the pure Scheduler: aborts of finished / unknown requests are no-ops ---------------


def test_scheduler_abort_is_idempotent_and_ignores_unknown_ids():
    aborted = RequestStatus.FINISHED_ABORTED
    scheduler = Scheduler(max_running=2)
    a, b, c = (make_request(rid, prompt=3, max_tokens=2) for rid in "abc")
    for request in (a, b, c):
        scheduler.add(request)
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=0)
    plan = scheduler.build_plan()
    assert [s.request_id for s in plan.new_seqs] == ["a", "b"] and scheduler.num_waiting == 1

    # a running request, aborted twice: dropped once
    assert scheduler.abort(RequestId("a"), aborted) is a
    assert scheduler.abort(RequestId("a"), aborted) is None
    assert scheduler.pending_drops() == ("a",)
    # unknown ids: nothing happens
    assert scheduler.abort(RequestId("nope"), aborted) is None
    assert scheduler.abort(RequestId(""), aborted) is None
    # a waiting request: leaves the queue, never reached the model so nothing to drop
    assert scheduler.abort(RequestId("c"), aborted) is c
    assert scheduler.abort(RequestId("c"), aborted) is None
    assert scheduler.num_waiting == 0 and scheduler.pending_drops() == ("a",)

    # b finishes (max_tokens=2); a's late token is ignored
    touched = scheduler.apply(StepResult(step_id=plan.step_id, sampled=(("a", (50,)), ("b", (50, 51)))))
    assert touched == [b] and b.status == RequestStatus.FINISHED_LENGTH
    assert a.num_output_tokens == 0
    # aborting the finished request changes nothing: not its status, not the drops
    assert scheduler.abort(RequestId("b"), aborted) is None
    assert b.status == RequestStatus.FINISHED_LENGTH
    assert scheduler.pending_drops() == ("a", "b")

    drop_plan = scheduler.build_plan()
    assert drop_plan.finished_ids == ("a", "b")
    assert drop_plan.new_seqs == () and drop_plan.decode_ids == ()
    assert scheduler.pending_drops() == ()
    for rid in ("a", "b", "c", "nope"):
        assert scheduler.abort(RequestId(rid), aborted) is None
    assert scheduler.pending_drops() == () and not scheduler.has_work
    assert scheduler.build_plan() is None  # nothing is freed a second time


def test_scheduler_abort_of_a_request_not_yet_sent_to_the_model():
    """Started (a slot taken) but aborted before its first plan: the plan never starts it and
    names it once among the drops; a second abort is a no-op."""
    scheduler = Scheduler(max_running=4)
    d = make_request("d", prompt=3, max_tokens=2)
    scheduler.add(d)
    for request in scheduler.pop_startable():
        scheduler.start(request, num_cached_tokens=0)
    assert scheduler.abort(RequestId("d"), RequestStatus.FINISHED_ABORTED) is d
    assert scheduler.abort(RequestId("d"), RequestStatus.FINISHED_ABORTED) is None
    assert scheduler.pending_drops() == ("d",)
    plan = scheduler.build_plan()
    assert plan.new_seqs == () and plan.decode_ids == () and plan.finished_ids == ("d",)
    assert scheduler.build_plan() is None
