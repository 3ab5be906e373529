"""``bench soak``: the request mix, the leak checks, and a short soak on demo:tiny.

The short soak asserts on what is exact (answers, engine and prefix-cache state, Trio tasks,
file descriptors, live per-request objects, MLX active memory after the probe), never on RSS:
60 requests are too few for a steady allocator.
"""

from __future__ import annotations

import collections
import sys

import attrs
import pytest
import trio

from vllm_mlx_trio.bench.soak.mix import MIX, malformed_cases, plan_requests
from vllm_mlx_trio.bench.soak.probe import Snapshot, live_objects
from vllm_mlx_trio.bench.soak.run import SoakOptions, SoakResult, Tally, outcome_rows, run_soak
from vllm_mlx_trio.cli import main


def test_the_mix_is_seeded_and_in_proportion():
    plan = plan_requests(200, 7, "m", 8)
    assert plan == plan_requests(200, 7, "m", 8)
    assert plan != plan_requests(200, 8, "m", 8)
    counts = collections.Counter(req.kind for req in plan)
    assert counts == {kind: 200 * percent // 100 for kind, percent in MIX}
    assert all(1 <= req.cancel_after_chunks <= 8 for req in plan if req.kind == "cancel_stream")
    names = [case[0] for case in malformed_cases("m")]
    assert len(names) == len(set(names))
    assert all(400 <= case[3] < 500 for case in malformed_cases("m"))


def _snapshot(**changes) -> Snapshot:
    base = dict(
        mlx_active_bytes=1000,
        mlx_active_spread=0,
        mlx_cache_bytes=0,
        rss_bytes=100 * 2**20,
        max_rss_bytes=100 * 2**20,
        fds=10,
        tasks=20,
        threads=2,
        engine_requests=0,
        running=0,
        waiting=0,
        plans_in_flight=0,
        cache_leased=0,
        cache_blocks_in_use=0,
        cache_blocks=0,
        cache_hits=0,
        objects={"RequestStream": 0},
    )
    return Snapshot(**(base | changes))


def _result(after: Snapshot, *, errors: int = 0, soak_rss: int = 100 * 2**20) -> SoakResult:
    refill = Tally(rss_samples=[(300, 100 * 2**20)])  # RSS at the refill's last answer
    tally = Tally(num_errors=errors, rss_samples=[(500, 99 * 2**20), (1000, soak_rss)])
    return SoakResult(
        options=SoakOptions(requests=1000),
        model="m",
        warmup=Tally(),
        refill=refill,
        tally=tally,
        baseline=_snapshot(),
        after=after,
        start_rss_bytes=None,
        quiet=True,
        wall_s=1.0,
    )


@pytest.mark.parametrize(
    ("after", "errors", "failed"),
    [
        (_snapshot(), 0, []),
        (_snapshot(rss_bytes=130 * 2**20), 0, []),  # an idle reading is shown, not checked
        (_snapshot(engine_requests=1, running=1), 0, ["engine holds no request"]),
        (_snapshot(cache_leased=1, cache_blocks_in_use=2), 0, ["prefix cache"]),
        (_snapshot(tasks=21, fds=11), 0, ["Trio tasks", "open fds"]),
        (_snapshot(mlx_active_bytes=1001), 0, ["MLX active memory"]),
        (_snapshot(mlx_active_bytes=1004, mlx_active_spread=4), 0, []),  # within the probes' spread
        (_snapshot(objects={"RequestStream": 3}), 0, ["per-request objects"]),
        (_snapshot(), 2, ["every answer as expected"]),
    ],
)
def test_each_leak_fails_its_check(after, errors, failed):
    result = _result(after, errors=errors)
    names = [name for name, ok, _detail in result.checks() if not ok]
    assert len(names) == len(failed) == len(result.failures())
    assert all(name.startswith(prefix) for name, prefix in zip(names, failed, strict=False))


@pytest.mark.parametrize(("soak_rss", "ok"), [(100 * 2**20 + 2**19, True), (101 * 2**20, False)])
def test_rss_growth_is_last_answer_against_last_answer(soak_rss, ok):
    result = _result(_snapshot(), soak_rss=soak_rss)  # 0.5 MiB per 1000 passes, 1 MiB fails
    assert result.rss_growth_mib_per_1000 == (soak_rss - 100 * 2**20) / 2**20
    assert [name for name, passed, _ in result.checks() if not passed] == (
        [] if ok else ["RSS growth < 1 MiB per 1000 requests"]
    )


def test_cli_rejects_a_soak_of_no_requests(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "soak", "--requests", "0"])
    assert "must be >= 1" in capsys.readouterr().err


@pytest.mark.mlx
async def test_a_short_soak_on_demo_tiny_leaves_nothing_behind(demo_cfg):
    options = SoakOptions(requests=60, concurrency=8, max_tokens=4, warmup=20, refill=10, quiesce_timeout_s=5.0)
    with trio.fail_after(60):
        result = await run_soak(demo_cfg, options)
    assert result.warmup.errors == [] and result.tally.errors == []
    assert result.failures(rss_limit_mib=None) == []
    rows = {row["kind"]: row for row in outcome_rows(result.tally)}
    assert rows["total"]["sent"] == 60 and rows["total"]["error"] == 0
    for kind in ("stream_chat", "chat", "completion"):
        assert rows[kind]["ok"] == rows[kind]["sent"] > 0
    assert rows["malformed"]["rejected"] == rows["malformed"]["sent"] == 9
    # Requests really were cancelled mid-flight, and prefix blocks really were leased: a
    # cancelled request that kept its engine slot, its lease or its stream fails the checks.
    assert rows["cancel_stream"]["cancelled"] + rows["cancel_wait"]["cancelled"] > 0
    before, after = result.baseline, result.after
    assert after.cache_hits > before.cache_hits
    # the probes that follow the clear leave their own short prompt cached (token-granular reuse)
    assert after.engine_idle and after.cache_released and after.cache_blocks == before.cache_blocks <= 2
    assert after.tasks <= before.tasks and after.fds <= before.fds
    assert all(after.objects[name] <= before.objects[name] for name in before.objects)
    assert after.mlx_active_bytes > 0 and before.mlx_active_bytes > 0
    assert attrs.asdict(result.options)["requests"] == 60


def test_a_retained_exception_counts_and_a_stack_walk_does_not():
    """A kept exception keeps its traceback: counted. Walking the running stack (as ``logging``
    does to find its caller) makes frame objects that live as long as their calls: not counted."""
    before = live_objects()["traceback"]
    kept = []
    try:
        raise ValueError("kept")
    except ValueError as exc:
        kept.append(exc)
    assert live_objects()["traceback"] == before + 1
    kept.clear()
    frames, frame = [], sys._getframe()
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    assert live_objects()["traceback"] == before and len(frames) > 3
