"""The GPU check's pieces (``make bench-gpu``): the models' shapes, their tiny stand-ins' files,
the summary of ``bench all``'s JSON, cuBLAS on the BLAS line, and the script's options. Nothing
here runs on a GPU or measures speed."""

from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

from vllm_mlx_trio.bench.gpu_check.__main__ import main as gpu_check_main
from vllm_mlx_trio.bench.gpu_check.summary import format_summary, summary_rows
from vllm_mlx_trio.bench.machine import describe_blas
from vllm_mlx_trio.worker.demo.recipe import DEMO_SIZES
from vllm_mlx_trio.worker.demo.shaped import (
    LM_HEAD,
    QWEN3_0_6B,
    QWEN3_8B,
    build_shaped_model,
    check_shapes,
    is_built,
)

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_shapes_count_the_real_models_parameters():
    """Qwen3-0.6B (tied embeddings) and Qwen3-8B (its own lm_head), as their checkpoints count them."""
    assert QWEN3_0_6B.num_parameters == 596_049_920
    assert QWEN3_8B.num_parameters == 8_190_735_360
    assert QWEN3_0_6B.tie_word_embeddings and not QWEN3_8B.tie_word_embeddings


def test_dry_run_shapes_are_tiny_and_keep_the_head_layout():
    dry = check_shapes(dry_run=True)
    assert [s.name for s in dry] == ["qwen3-0.6b-shape-dry-run", "qwen3-8b-shape-dry-run"]
    assert all(s.size == DEMO_SIZES["tiny"] for s in dry)
    assert [s.tie_word_embeddings for s in dry] == [True, False]
    assert check_shapes(dry_run=False) == (QWEN3_0_6B, QWEN3_8B)


def safetensors_header(path: pathlib.Path) -> dict:
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(size))


@pytest.mark.mlx
def test_stand_ins_are_bfloat16_qwen3_checkpoints_reused_while_their_shape_holds(tmp_path):
    tied, untied = check_shapes(dry_run=True)
    for shape in (tied, untied):
        directory = build_shaped_model(tmp_path / shape.name, shape)
        config = json.loads((directory / "config.json").read_text())
        header = safetensors_header(directory / "model.safetensors")
        tensors = {k: v for k, v in header.items() if k != "__metadata__"}
        assert config["tie_word_embeddings"] is shape.tie_word_embeddings
        assert config["vocab_size"] == shape.size.vocab_size and config["model_type"] == "qwen3"
        assert (LM_HEAD in tensors) is not shape.tie_word_embeddings
        assert {t["dtype"] for t in tensors.values()} == {"BF16"}
        count = sum(_product(t["shape"]) for t in tensors.values())
        assert count == shape.num_parameters
        assert is_built(directory, shape) and not is_built(directory, tied if shape is untied else untied)

    weights = tmp_path / untied.name / "model.safetensors"
    before = weights.stat().st_mtime_ns
    build_shaped_model(tmp_path / untied.name, untied)
    assert weights.stat().st_mtime_ns == before  # reused, not drawn again


def _product(shape: list[int]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def bench_all_payload(model: str) -> dict:
    """What ``bench all --json`` writes for one model: ceiling, engine, HTTP sections."""
    machine = {
        "platform": "Linux x86_64 (test)",
        "python": "3.12",
        "cpu_count": 16,
        "mlx": "0.32.4",
        "mlx_lm": "0.32.2",
        "device": "gpu",
        "blas": "cuBLAS (libcublas.so.12) on the GPU, reference (libblas.so.3 bundled with mlx) on the CPU",
    }
    ceiling = [
        {"path": "mlx-lm generate_step", "conc": 1, "agg_tok_s": 200.0, "vs_ceiling": 1.0},
        {"path": "mlx-lm BatchGenerator-16", "conc": 16, "agg_tok_s": 2000.0, "vs_ceiling": 1.0},
    ]
    engine = [
        {"path": "engine batched", "conc": 1, "agg_tok_s": 180.0, "vs_ceiling": 0.9},
        {"path": "engine batched", "conc": 16, "agg_tok_s": 1900.0, "vs_ceiling": 0.95},
    ]
    http = [{"path": "our HTTP (batched)", "conc": 16, "agg_tok_s": 1500.0, "vs_ceiling": 0.75}]
    return {
        "sections": [
            {"kind": "ceiling", "model": f"/cache/bench-gpu/{model}", "machine": machine, "rows": ceiling},
            {"kind": "engine", "model": f"/cache/bench-gpu/{model}", "machine": machine, "rows": engine},
            {"kind": "http", "model": f"/cache/bench-gpu/{model}", "machine": machine, "rows": http},
        ]
    }


def test_summary_puts_each_row_beside_its_models_ceiling_at_its_level():
    rows = summary_rows(bench_all_payload("qwen3-8b-shape"))
    assert [(r["conc"], r["path"], r["ceiling_tok_s"], r["vs_ceiling"]) for r in rows] == [
        (1, "engine batched", 200.0, 0.9),
        (16, "engine batched", 2000.0, 0.95),
        (16, "our HTTP (batched)", 2000.0, 0.75),
    ]
    assert {r["model"] for r in rows} == {"qwen3-8b-shape"}


def test_summary_reads_every_file_and_says_which_run_did_not_finish(tmp_path, capsys):
    done = tmp_path / "bench-all-qwen3-0.6b-shape.json"
    done.write_text(json.dumps(bench_all_payload("qwen3-0.6b-shape")))
    missing = tmp_path / "bench-all-qwen3-8b-shape.json"
    text, complete = format_summary([done, missing])
    assert not complete
    assert f"{missing}: no results" in text and text.count("device: gpu") == 1
    assert "qwen3-0.6b-shape | 16   | our HTTP (batched) | 1500.0" in text
    assert gpu_check_main(["summary", str(done)]) == 0
    assert "cuBLAS (libcublas.so.12) on the GPU" in capsys.readouterr().out


def test_blas_line_names_cublas_beside_the_cpu_blas():
    libraries = [
        "/venv/nvidia/cublas/lib/libcublasLt.so.12",
        "/venv/nvidia/cublas/lib/libcublas.so.12",
        "/venv/mlx_cuda_12.libs/libblas-bd8a282c.so.3.10.0",
    ]
    assert describe_blas(libraries) == (
        "cuBLAS (libcublas.so.12) on the GPU, reference (libblas-bd8a282c.so.3.10.0 bundled with mlx) on the CPU"
    )
    assert describe_blas(libraries[2:]) == "reference (libblas-bd8a282c.so.3.10.0 bundled with mlx)"


def test_script_parses_and_lists_its_options():
    script = REPO / "scripts" / "bench_gpu.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    shown = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True, check=True).stdout
    for option in ("--out", "--dry-run", "--venv", "--no-install", "--extra", "--max-tokens", "--budget-s"):
        assert option in shown
    refused = subprocess.run(["bash", str(script), "--bogus"], capture_output=True, text=True)
    assert refused.returncode == 2 and "unknown option --bogus" in refused.stderr
