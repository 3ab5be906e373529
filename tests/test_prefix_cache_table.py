"""``vllm-mlx-trio bench prefix-cache``: its table on demo:tiny passes every row; the table's
format and the lookup-kind classification on made-up statistics."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio.actors.prefix.cache_manager import CacheStatistics
from vllm_mlx_trio.bench.prefix_cache import run as bench
from vllm_mlx_trio.bench.prefix_cache.run import check_prefix_cache
from vllm_mlx_trio.bench.prefix_cache.table import (
    SHORT_REPEAT_TOKENS,
    Outcome,
    Row,
    format_rows,
    lookup_kind,
    request_row,
    same_tokens_row,
)
from vllm_mlx_trio.cli import main
from vllm_mlx_trio.core.prefix.block_pool import BlockPool

TIMEOUT_S = 120


@pytest.mark.mlx
async def test_every_row_passes_on_demo_tiny(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        rows = await check_prefix_cache(demo_cfg)
    table = format_rows(rows)
    assert all(row.passed for row in rows), table
    steps = [row.step for row in rows]
    assert steps == [
        "1a",
        "1b",
        "1c",
        "1d",
        "1e",
        "2a",
        "2b",
        "2c",
        "2d",
        "2e",
        "2f",
        "2g",
        "3a",
        "3b",
        "4a",
        "4b",
        "5a",
        "5b",
        "5c",
        "5d",
        "5e",
        "5f",
        "6a",
        "6b",
        "6c",
    ]
    by_step = {row.step: row for row in rows}
    assert by_step["1b"].actual == "HIT" and by_step["1b"].cached_tokens > 0
    assert by_step["2a"].actual == "PREFIX_HIT"
    assert 0 < by_step["2a"].cached_tokens <= by_step["1b"].cached_tokens
    # the short exact repeat: 5 at once, each reusing 47 of its 48 tokens; its TTFT ratio is read
    assert by_step["2e"].cached_tokens == SHORT_REPEAT_TOKENS - 1 and by_step["2e"].passed
    assert by_step["2f"].info and by_step["2f"].cells()[-1] == "INFO"
    # a restarted engine over the same disk directory: prompt 1 read back from disk, same output
    assert by_step["6a"].cached_tokens > 0 and "blocks read from disk" in by_step["6a"].actual
    assert by_step["6c"].passed


def test_the_mlx_lm_comparison_rows_read_medians_and_the_target():
    from vllm_mlx_trio.bench.prefix_cache.vs_mlx_lm import figure_rows

    figures = {
        "ours": {"cold": [2.0, 2.6, 3.0], "repeat": [0.4, 0.5, 0.9]},
        "mlx-lm": {"cold": [1.0, 1.1, 1.3], "repeat": [0.6, 1.1, 1.2]},
    }
    rows = figure_rows(figures)
    assert [r.step for r in rows] == ["7a", "7b", "7c"] and all(r.info for r in rows)
    assert rows[0].actual == "2600 ms (2000-3000) -> 500 ms (400-900)"
    assert rows[2].actual == "0.19, 0.45 (target met)"
    figures["ours"]["repeat"] = [1.5, 1.5, 1.5]
    assert figure_rows(figures)[2].actual == "0.58, 1.36 (target missed)"
    figures["main"] = {"cold": [2.0, 2.0, 2.0], "repeat": [2.2, 2.2, 2.2]}  # a --variant checkout's server
    variant = figure_rows(figures)[3]
    assert variant.step == "7v1" and variant.info
    assert variant.actual == "2000 ms (2000-2000) -> 2200 ms (2200-2200) (2.00)"


def _stats(enabled: bool = True, **counts: int) -> CacheStatistics:
    pool = BlockPool().stats()
    return CacheStatistics(
        enabled=enabled,
        num_queries=0,
        num_hits=counts.get("hits", 0),
        num_prefix_hits=counts.get("prefix_hits", 0),
        num_misses=counts.get("misses", 0),
        num_commits=0,
        num_releases=0,
        num_leased=0,
        pool=pool,
    )


def test_lookup_kind_from_counter_deltas():
    base = _stats(hits=2, prefix_hits=1, misses=3)
    assert lookup_kind(base, _stats(hits=3, prefix_hits=1, misses=3)) == "HIT"
    assert lookup_kind(base, _stats(hits=2, prefix_hits=2, misses=3)) == "PREFIX_HIT"
    assert lookup_kind(base, _stats(hits=2, prefix_hits=1, misses=4)) == "MISS"
    assert lookup_kind(base, base) == "NONE"  # an enabled cache must count every lookup
    assert lookup_kind(base, _stats(hits=3, prefix_hits=1, misses=4)) == "?"
    off = _stats(enabled=False)
    assert lookup_kind(off, off) == "MISS"  # a disabled cache counts nothing, reuses nothing


def test_request_row_checks_kind_and_cached_tokens_agree():
    hit = Outcome(kind="HIT", cached_tokens=128, token_ids=(1, 2))
    assert request_row("1b", "Same prompt", ("HIT",), hit).passed
    assert not request_row("1b", "Same prompt", ("HIT",), attrs.evolve(hit, cached_tokens=0)).passed
    miss = Outcome(kind="MISS", cached_tokens=0, token_ids=(1, 2))
    assert request_row("1c", "Other", ("MISS", "PREFIX_HIT"), miss).passed
    assert not request_row("1c", "Other", ("MISS",), attrs.evolve(miss, cached_tokens=64)).passed
    assert not same_tokens_row("1e", "Same", (hit, attrs.evolve(hit, token_ids=(1, 3)))).passed


def test_table_format():
    rows = [
        Row(
            step="1a",
            description="First request",
            expected="MISS",
            actual="MISS",
            passed=True,
            cached_tokens=0,
            ttft_ms=12.34,
        ),
        Row(
            step="1c",
            description="Different prompt",
            expected="MISS or PREFIX_HIT",
            actual="PREFIX_HIT",
            passed=False,
            cached_tokens=64,
        ),
        Row(
            step="3a",
            description="Clear the cache",
            expected="> 0 blocks dropped",
            actual="3 blocks dropped",
            passed=True,
        ),
    ]
    assert format_rows(rows).splitlines() == [
        "  Step   | Description      | Expected           | Actual           | Cached | TTFT ms | Status",
        "  1a     | First request    | MISS               | MISS             | 0      | 12.3    | PASS",
        "  1c     | Different prompt | MISS or PREFIX_HIT | PREFIX_HIT       | 64     | -       | FAIL",
        "  3a     | Clear the cache  | > 0 blocks dropped | 3 blocks dropped | -      | -       | PASS",
    ]


@pytest.mark.parametrize(("passed", "status"), [(True, 0), (False, 1)])
def test_cli_prints_the_table_and_exits_nonzero_on_a_failure(monkeypatch, capsys, passed, status):
    seen = {}

    async def fake_check(cfg, *, disabled_run):
        seen.update(model=cfg.model.path, disabled_run=disabled_run)
        return [Row(step="1a", description="First request", expected="MISS", actual="MISS", passed=passed)]

    monkeypatch.setattr(bench, "check_prefix_cache", fake_check)
    assert main(["bench", "prefix-cache", "--model", "demo:tiny", "--no-disabled"]) == status
    out = capsys.readouterr().out
    assert seen == {"model": "demo:tiny", "disabled_run": False}
    assert "  Step   | Description" in out and ("PASS" if passed else "FAIL") in out
