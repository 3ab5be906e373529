"""The pure core imports neither Trio nor MLX, and the package's public names load lazily."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from vllm_mlx_trio.testing.imports import imported_modules

REPO = pathlib.Path(__file__).resolve().parents[2]

NO_TRIO_NO_MLX = (
    "import sys; import {module}; "
    "loaded = [m for m in sys.modules if m == 'trio' or m == 'mlx' or m.startswith(('trio.', 'mlx.'))]; "
    "assert not loaded, loaded"
)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "module",
    [
        "vllm_mlx_trio.core",
        "vllm_mlx_trio.core.request, vllm_mlx_trio.core.scheduler, vllm_mlx_trio.core.prefix.block_pool",
        "vllm_mlx_trio.core.text, vllm_mlx_trio.core.params, vllm_mlx_trio.messages",
    ],
)
def test_the_core_imports_neither_trio_nor_mlx(module):
    result = run_python(NO_TRIO_NO_MLX.format(module=module))
    assert result.returncode == 0, result.stderr


def test_public_names_load_on_first_use():
    code = (
        "import sys, inspect, vllm_mlx_trio as p; "
        "assert 'vllm_mlx_trio.engine' not in sys.modules; "
        "from vllm_mlx_trio import Delta, Engine, EngineConfig, RequestStream, SamplingParams, Usage; "
        "from vllm_mlx_trio import load_config, open_engine, serve; "
        "import vllm_mlx_trio.serve; "
        "assert inspect.iscoroutinefunction(p.serve) and p.serve is serve; "
        "assert set(p.__all__) == set(p._EXPORTS) and set(p.__all__) <= set(dir(p)); "
        "assert all(getattr(p, name) is not None for name in p.__all__)"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


def test_an_unknown_name_is_an_attribute_error():
    import vllm_mlx_trio

    with pytest.raises(AttributeError, match="no_such_name"):
        vllm_mlx_trio.no_such_name  # noqa: B018 (the attribute access is what is tested)


def test_core_imports_nothing_above_it_but_the_error_tree():
    """core/ plans with its own data (core/plan.py); only errors.py, a leaf, comes from above.
    Every module of core/, core/prefix/ too; imports inside functions count."""
    core = REPO / "vllm_mlx_trio" / "core"
    paths = sorted(core.rglob("*.py"))
    assert core / "prefix" / "block_pool.py" in paths
    above = {
        module
        for path in paths
        for _, module in imported_modules(path, REPO)
        if module.startswith("vllm_mlx_trio.") and not (module + ".").startswith("vllm_mlx_trio.core.")
    }
    assert above <= {"vllm_mlx_trio.errors"}, above
