"""Smoke tests of the benchmark commands: figures from synthetic traces, and short runs on the
fake executor (and one on demo:tiny). Nothing here asserts on measured speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import trio

from vllm_mlx_trio.bench import peers
from vllm_mlx_trio.bench.engine import run_engine_bench
from vllm_mlx_trio.bench.http import BenchError, bench_own_server
from vllm_mlx_trio.bench.machine import describe_blas, machine_info, mapped_libraries
from vllm_mlx_trio.bench.report import format_seeds, format_table
from vllm_mlx_trio.bench.stats import RequestTrace, percentile, summarize
from vllm_mlx_trio.bench.workload import PromptBlocks, Workload, bench_prompts, parse_levels
from vllm_mlx_trio.cli import main
from vllm_mlx_trio.testing.harness import fake_executor_factory

TINY = Workload(max_tokens=4, concurrency=(1, 3), min_requests=2)


def test_percentile_interpolates_and_weights():
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile([1.0, 10.0], 50, weights=[3, 1]) == 1.0
    assert percentile([1.0, 10.0], 95, weights=[3, 1]) == 10.0


def test_summarize_counts_tokens_ttft_and_per_token_itl():
    # start 0; pieces at 1 s (1 token), 2 s (2 tokens), 3 s (1 token)
    arrivals = ((1.0, 1), (2.0, 2), (3.0, 1))
    trace = RequestTrace(start=0.0, arrivals=arrivals, completion_tokens=4, prompt_tokens=10)
    assert trace.ttft_s == 1.0
    assert trace.decode_tps == 1.5  # 3 tokens in the 2 s after the first
    assert trace.itl_samples() == [(0.5, 2), (1.0, 1)]
    row = summarize("x", 1, [trace])
    assert row["agg_tok_s"] == round(4 / 3, 1)
    assert (row["ttft_p50_ms"], row["itl_p50_ms"], row["itl_p95_ms"]) == (1000.0, 500.0, 1000.0)
    assert row["tok_per_req"] == "4" and row["prompt_tok"] == 10


def test_summarize_shows_uneven_counts_and_empty_requests():
    early = RequestTrace(start=0.0, arrivals=(), completion_tokens=0)
    full = RequestTrace(start=0.0, arrivals=((1.0, 1),), completion_tokens=1)
    row = summarize("x", 2, [early, full])
    assert row["tok_per_req"] == "0-1" and row["req_tok_s"] is None and row["itl_p50_ms"] is None


MAPS = """\
7f00-7f01 r-xp 00000000 fd:00 1 /usr/lib/x86_64-linux-gnu/libc.so.6
7f02-7f03 r-xp 00000000 fd:00 2 /venv/site-packages/mlx_cpu.libs/libblas-bd8a282c.so.3.10.0
7f04-7f05 rw-p 00000000 00:00 0 [heap]
"""
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"


def test_blas_detection_from_maps():
    libs = mapped_libraries(MAPS)
    assert len(libs) == 2
    assert describe_blas(libs) == "reference (libblas-bd8a282c.so.3.10.0 bundled with mlx)"
    preloaded = mapped_libraries(MAPS + f"7f06-7f07 r-xp 0 fd:00 3 {OPENBLAS}\n")
    assert describe_blas(preloaded, ld_preload=OPENBLAS) == "OpenBLAS (LD_PRELOAD)"
    assert describe_blas([], system="Darwin") == "Accelerate (macOS)"
    assert describe_blas(libs[:1]).startswith("unknown")
    info = machine_info()
    assert info["cpu_count"] and info["blas"]


def test_prompts_are_distinct_and_levels_parse():
    prompts = bench_prompts(40)
    assert len({tuple(p.split()[:5]) for p in prompts}) == 40  # no shared prefixes
    blocks = PromptBlocks()
    assert blocks.take(2) == prompts[:2] and blocks.take(3) == prompts[2:5]
    assert parse_levels("1, 5,16") == (1, 5, 16)
    for bad in ("0", "a", ""):
        with pytest.raises(ValueError):
            parse_levels(bad)
    assert TINY.num_requests(1) == 2 and TINY.num_requests(3) == 3


def test_table_and_seeds_formatting():
    text = format_table([{"path": "a", "conc": 1, "agg_tok_s": None}, {"path": "bb", "conc": 16}])
    assert text.splitlines()[0].split(" | ") == ["path", "conc", "agg_tok_s"]
    assert text.splitlines()[2].endswith("| -")
    row = {"path": "s", "conc": 1, "agg_tok_s": 10.0}
    seeds = {"prompts": ["a"] * 5, "max_tokens": 50, "sequential": row, "concurrent": row | {"conc": 5}, "speedup": 1.0}
    assert "completion tokens only" in format_seeds(seeds)


def test_engine_bench_on_the_fake_executor(fake_cfg):
    rows = run_engine_bench(fake_cfg, TINY, executor_factory=fake_executor_factory(step_s=0.001))
    assert [(r["path"], r["conc"], r["reqs"]) for r in rows] == [
        ("engine simple", 1, 2),
        ("engine batched", 1, 2),
        ("engine batched", 3, 3),
    ]
    assert all(r["tok_per_req"] == "4" and r["agg_tok_s"] and r["vs_ceiling"] is None for r in rows)


async def test_http_bench_on_our_server_with_the_fake_executor(fake_cfg):
    with trio.fail_after(15):
        result = await bench_own_server(fake_cfg, TINY, executor_factory=fake_executor_factory(step_s=0.001))
    assert [r["conc"] for r in result["rows"]] == [1, 3]
    assert all(r["count_from"] == "usage" and r["tok_per_req"] == "4" for r in result["rows"])
    assert result["ignore_eos_sent"] is True
    seeds = result["seeds"]
    assert seeds["sequential"]["reqs"] == seeds["concurrent"]["reqs"] == 5 and seeds["speedup"]


def test_peer_command_lines_and_process_helpers(tmp_path):
    ours = peers.peer_server("ours", "/m", 9001)
    assert "model.path=/m" in ours.argv and "server.port=9001" in ours.argv and ours.model == "/m"
    assert peers.peer_server("mlx-lm", "/m", 9002).argv[1:4] == ("-m", "mlx_lm.server", "--model")
    vllm = peers.peer_server("vllm-mlx", "/m", 9003, vllm_mlx="/bin/vllm-mlx", scratch=str(tmp_path))
    assert vllm.argv == ("/bin/vllm-mlx", "serve", "/m", "--port", "9003", "--continuous-batching")
    assert vllm.env == {"HOME": str(tmp_path)}
    with pytest.raises(ValueError):
        peers.peer_server("nope", "/m", 1)
    assert peers.peak_rss_mib(os.getpid()) > 0
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    with pytest.raises(BenchError, match="exited"):
        peers.wait_ready(proc, "http://127.0.0.1:9", timeout_s=10)
    missing = peers.PeerServer(name="x", argv=(str(tmp_path / "missing"),), model=None)
    assert "not found" in peers.run_peer(missing, 9, None, startup_timeout_s=1, log_dir=tmp_path)["error"]


def test_cli_rejects_bad_levels(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "engine", "--concurrency", "0"])
    assert "concurrency levels must be >= 1" in capsys.readouterr().err


@pytest.mark.mlx
def test_bench_ceiling_on_demo_tiny(tmp_path, capsys, demo_cache_dir):
    out = tmp_path / "ceiling.json"
    argv = [
        "bench",
        "ceiling",
        "--set",
        f"model.demo_cache_dir={demo_cache_dir}",
        "--max-tokens",
        "4",
        "--concurrency",
        "1,2",
        "--requests",
        "2",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "BLAS:" in printed and "mlx-lm BatchGenerator-2" in printed
    rows = json.loads(out.read_text())["sections"][0]["rows"]
    assert [r["tok_per_req"] for r in rows] == ["4", "4"]


@pytest.mark.mlx
def test_bench_single_on_demo_tiny_times_all_three_paths(tmp_path, demo_cache_dir):
    """The ceiling, the engine and the HTTP stream (read by the lean client) each give every token."""
    out = tmp_path / "single.json"
    argv = ["bench", "single", "--set", f"model.demo_cache_dir={demo_cache_dir}", "--model", "demo:tiny"]
    assert main([*argv, "--max-tokens", "4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"].split(" (")[0] for r in rows] == ["mlx-lm generate_step", "engine in-process", "HTTP stream"]
    assert [r["completion_tokens"] for r in rows] == [20, 20, 20]
    assert all(r["ttft_p50_ms"] > 0 and r["decode_tok_s"] > 0 for r in rows)


def test_ttft_rows_report_medians_and_distance_to_the_ceiling():
    from vllm_mlx_trio.bench.ttft import ttft_rows

    rows = ttft_rows(
        {
            "mlx-lm generate_step": [0.010, 0.012, 0.011],
            "engine batched": [0.013, 0.020, 0.014],
            "engine simple": [0.011, 0.011, 0.030],
        }
    )
    by_path = {row["path"]: row for row in rows}
    assert by_path["mlx-lm generate_step"]["vs_ceiling_ms"] == 0.0
    assert by_path["engine batched"]["ttft_p50_ms"] == 14.0
    assert by_path["engine batched"]["vs_ceiling_ms"] == 3.0
    assert by_path["engine simple"]["ttft_max_ms"] == 30.0


def test_shipped_code_imports_nothing_from_testing():
    """bench/ and everything else outside vllm_mlx_trio/testing/ use only the public pieces."""
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[1] / "vllm_mlx_trio"
    offenders = []
    for path in package.rglob("*.py"):
        if "testing" in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            offenders += [f"{path.relative_to(package)}: {n}" for n in names if "testing" in n.split(".")]
    assert not offenders


CEILING_IN_A_CHILD = """
import sys
from vllm_mlx_trio.bench.ceiling.run import run_ceiling_bench
from vllm_mlx_trio.bench.workload import Workload
from vllm_mlx_trio.config import load_config

cfg = load_config(None, overrides=["model.demo_cache_dir=" + sys.argv[1]], environ={})
result = run_ceiling_bench(cfg, Workload(max_tokens=3, concurrency=(1, 2), min_requests=2))
print([row["tok_per_req"] for row in result.rows], result.machine["device"], "mlx.core" in sys.modules)
"""


@pytest.mark.mlx
def test_the_ceiling_runs_mlx_in_a_child_process_only(demo_cache_dir):
    out = subprocess.run(
        [sys.executable, "-c", CEILING_IN_A_CHILD, demo_cache_dir],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    rows, device, mlx_here = out.strip().rsplit(" ", 2)
    assert rows == "['3', '3']" and device != "n/a" and mlx_here == "False", out


def test_the_ceiling_process_reports_failures():
    import io

    from vllm_mlx_trio.worker.ceiling import serve_commands

    replies = io.StringIO()
    serve_commands(io.StringIO('{"op": "encode", "messages": []}\n'), replies)
    assert json.loads(replies.getvalue()) == {"error": "RuntimeError: 'encode' before 'load'"}
