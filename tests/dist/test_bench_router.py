"""``bench router``: its table from rows, and a short real run (one replica, direct and behind the router)."""

from __future__ import annotations

import json

import pytest
from replicas import ROUTER

from vllm_mlx_trio.bench.http import BenchError
from vllm_mlx_trio.bench.router import RouterBenchArgs, run_router_bench, summary_rows
from vllm_mlx_trio.bench.workload import Workload
from vllm_mlx_trio.cli import main


def test_summary_is_the_median_and_spread_per_target_and_level():
    rows = {
        "direct": [{"conc": 1, "agg_tok_s": v, "itl_p50_ms": 10.0} for v in (100.0, 300.0, 200.0)],
        "tp-2": [{"conc": 1, "agg_tok_s": 50.0, "itl_p50_ms": None}],
    }
    direct, sharded = summary_rows(rows)
    assert (direct["target"], direct["rounds"], direct["agg_tok_s"], direct["agg_tok_s_spread"]) == (
        "direct",
        3,
        200.0,
        "100.0-300.0",
    )
    assert sharded["itl_p50_ms"] is None and sharded["agg_tok_s"] == 50.0


def test_unknown_targets_are_refused_before_anything_starts():
    with pytest.raises(BenchError, match="unknown targets"):
        run_router_bench(RouterBenchArgs(model_dir="x", targets=("direct", "nope")), Workload())


@pytest.mark.mlx
@pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router is not installed (the test extra has it)")
def test_a_short_run_behind_the_router(tmp_path, demo_cache_dir, capsys):
    out = tmp_path / "router.json"
    code = main(
        [
            "bench",
            "router",
            "--set",
            f"model.demo_cache_dir={demo_cache_dir}",
            "--targets",
            "direct,router-1",
            "--rounds",
            "1",
            "--max-tokens",
            "4",
            "--concurrency",
            "1",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(row["target"], row["conc"], row["rounds"]) for row in rows] == [("direct", 1, 1), ("router-1", 1, 1)]
    assert all(row["agg_tok_s"] for row in rows)
    assert "router-1" in capsys.readouterr().out
