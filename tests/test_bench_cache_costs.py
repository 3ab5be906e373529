"""``bench disk-tier`` and ``bench state-snapshots``: their arguments, their tables from made-up
runs, and one tiny run of each on MLX; the subcommands' handlers and the vllm-mlx lookup of
``bench peers``. Nothing here asserts on measured speed."""

from __future__ import annotations

import json

import pytest

from vllm_mlx_trio.bench import handlers, peers
from vllm_mlx_trio.bench.disk_tier import disk_tier_rows
from vllm_mlx_trio.bench.state_snapshots import snapshot_rows
from vllm_mlx_trio.cli import _parser, main


def _bench_subparsers():
    bench = _parser()._subparsers._group_actions[0].choices["bench"]
    return bench._subparsers._group_actions[0].choices


def test_every_bench_subcommand_carries_its_handler():
    subparsers = _bench_subparsers()
    assert {"disk-tier", "state-snapshots", "prefix-cache", "all", "peers"} <= set(subparsers)
    for name, parser in subparsers.items():
        assert callable(parser.get_default("handler")), name
    assert subparsers["all"].get_default("handler") is handlers.all_models


def test_cache_cost_arguments_parse():
    args = _parser().parse_args(["bench", "disk-tier", "--blocks", "2", "--dtype", "bfloat16"])
    assert (args.blocks, args.runs, args.layers, args.block_tokens, args.dtype) == (2, 3, 32, 64, "bfloat16")
    assert args.handler is handlers.disk_tier
    args = _parser().parse_args(["bench", "state-snapshots", "--values", "0,8"])
    assert (args.values, args.models, args.block_size) == ((0, 8), "qwen3_next,gemma3_text", 64)


@pytest.mark.parametrize("values", ["-1", "x", ""])
def test_state_snapshot_values_are_counts(values, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "state-snapshots", "--values", values])
    assert "--values" in capsys.readouterr().err


def test_tables_from_made_up_runs():
    runs = [
        {"spill_ms": 1.0, "written_ms": 50.0, "load_ms": 30.0},
        {"spill_ms": 3.0, "written_ms": 40.0, "load_ms": 35.0},
    ]
    rows = disk_tier_rows(runs)
    assert [r["ms_per_block"] for r in rows] == ["2.0 (1.0-3.0)", "45.0 (40.0-50.0)", "32.5 (30.0-35.0)"]
    off = {"cold_s": 1.0, "shared_s": 1.0, "cached": 0, "snapshot_bytes": 0, "block_bytes": 4096}
    on = {**off, "shared_s": 0.1, "cached": 64, "snapshot_bytes": 512}
    rows = snapshot_rows({0: [off], 1: [on]})
    assert [(r["cached_tokens"], r["snapshot_bytes"]) for r in rows] == [(0, None), (64, 512)]
    assert rows[1]["shared_prefix_ttft_ms"] == "100 (100-100)"


def test_vllm_mlx_is_found_by_option_environment_or_path(monkeypatch, tmp_path):
    assert peers.vllm_mlx_executable("/opt/v/bin/vllm-mlx", {peers.VLLM_MLX_ENV: "/e"}) == "/opt/v/bin/vllm-mlx"
    assert peers.vllm_mlx_executable(None, {peers.VLLM_MLX_ENV: "/e/vllm-mlx"}) == "/e/vllm-mlx"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert peers.vllm_mlx_executable(None, {}) == "vllm-mlx"  # not found: the peer is left out
    exe = tmp_path / "vllm-mlx"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert peers.vllm_mlx_executable(None, {}) == str(exe)


@pytest.mark.mlx
def test_disk_tier_tiny_run(tmp_path, capsys):
    out = tmp_path / "dt.json"
    shape = ["--layers", "2", "--kv-heads", "1", "--block-tokens", "4", "--head-dim", "8"]
    assert main(["bench", "disk-tier", "--blocks", "2", "--runs", "1", *shape, "--json", str(out)]) == 0
    assert "spill until written" in capsys.readouterr().out
    payload = json.loads(out.read_text())
    assert payload["shape"]["layers"] == 2 and len(payload["runs"]) == 1 and len(payload["rows"]) == 3


@pytest.mark.mlx
def test_state_snapshots_tiny_run(tmp_path, demo_cache_dir):
    out = tmp_path / "ss.json"
    argv = ["bench", "state-snapshots", "--models", "qwen3_next", "--values", "0,1", "--runs", "1"]
    argv += ["--block-size", "16", "--system-words", "40", "--json", str(out)]
    argv += ["--set", f"model.demo_cache_dir={demo_cache_dir}"]
    assert main(argv) == 0
    off, on = json.loads(out.read_text())["models"]["qwen3_next"]["rows"]
    # Off, nothing of the shared system prompt is reused. (Its snapshot_bytes may still count one
    # block: a prompt whose salted length ends on a block boundary leaves its end checkpoint as a
    # tail of no tokens, which the table cannot tell from a snapshot.)
    assert off["cached_tokens"] == 0
    assert on["cached_tokens"] > 0 and on["snapshot_bytes"] > 0
