"""The package's layers: MLX is the worker's alone.

Everything outside ``vllm_mlx_trio/worker/`` (the actors, HTTP, config, the benchmarks'
drivers, the test helpers) runs without MLX; it reaches the model only through the worker.
The check reads every module's imports with ``ast``, those inside functions too, so a lazy
``import mlx.core`` in a handler counts as much as one at the top.
"""

from __future__ import annotations

import pathlib

import pytest

from vllm_mlx_trio.testing.imports import imported_modules

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "vllm_mlx_trio"
#: The one room allowed to import them.
WORKER = PACKAGE / "worker"
#: Top-level modules that are MLX (mlx_lm and mlx_vlm import mlx as they load).
MLX_MODULES = frozenset({"mlx", "mlx_lm", "mlx_vlm"})


def is_mlx(module: str) -> bool:
    return module.partition(".")[0] in MLX_MODULES


def outside_the_worker() -> list[pathlib.Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if WORKER not in p.parents)


def mlx_imports(paths, root: pathlib.Path = REPO) -> list[str]:
    """``path:line: module`` for each import of MLX in ``paths``."""
    return [
        f"{path.relative_to(root)}:{line}: {module}"
        for path in paths
        for line, module in imported_modules(path, root)
        if is_mlx(module)
    ]


def test_only_the_worker_imports_mlx():
    paths = outside_the_worker()
    assert len(paths) > 50 and PACKAGE / "http" / "app.py" in paths and PACKAGE / "testing" / "harness.py" in paths
    assert mlx_imports(paths) == []


@pytest.mark.parametrize(
    ("source", "module"),
    [
        ("import mlx.core as mx\n", "mlx.core"),
        ("from mlx_vlm import load\n", "mlx_vlm"),
        ("def later():\n    from mlx_lm.generate import generate_step\n", "mlx_lm.generate"),
        ("import importlib\nmx = importlib.import_module('mlx.core')\n", "mlx.core"),
    ],
)
def test_the_check_sees_every_way_in(tmp_path, source, module):
    """The same check on a module outside the worker that does import MLX, in each form."""
    probe = tmp_path / "vllm_mlx_trio" / "http" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(source)
    last_line = source.count("\n")  # each source's import is on its last line
    assert mlx_imports([probe], root=tmp_path) == [f"vllm_mlx_trio/http/probe.py:{last_line}: {module}"]


def test_relative_imports_resolve_to_the_worker_not_to_mlx(tmp_path):
    """``from ..worker.ceiling import mlx_device`` (as bench/machine.py does) names the worker:
    allowed; so are modules of ours whose names merely begin with "mlx"."""
    probe = tmp_path / "vllm_mlx_trio" / "bench" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("def device():\n    from ..worker.ceiling import mlx_device\n\nfrom .mlx_names import x\n")
    modules = sorted(module for _, module in imported_modules(probe, tmp_path))
    assert modules == ["vllm_mlx_trio.bench.mlx_names", "vllm_mlx_trio.worker.ceiling"]
    assert mlx_imports([probe], root=tmp_path) == []
