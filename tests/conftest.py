"""Shared fixtures: configs for the fake and the real demo model."""

from __future__ import annotations

import logging
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

#: MKL under MLX (cpu_blas.py) picks its matrix kernels by shape, so a row's float32 product can
#: differ in the last bits with the number of rows, in every MKL_CBWR mode on an AMD EPYC; the
#: tests compare outputs across batch shapes (alone and batched, preempted and not, seeded
#: samples), so MLX runs on its reference BLAS here, which gives a row the same bits in any
#: batch. The choice is read when the package is first imported: this module imports it only
#: inside its fixtures. tests/test_cpu_blas.py checks MKL's loading in processes of its own;
#: docs/getting-started.md says what the choice costs.
os.environ.setdefault("VLLM_MLX_TRIO_BLAS", "off")


def pytest_unconfigure(config):
    """Destroy the main thread's MLX streams before the interpreter ends (MLX 0.32 leaves that to
    the caller; otherwise the process may abort at exit after every test passed)."""
    if "mlx.core" in sys.modules:
        from vllm_mlx_trio.worker.thread_streams import release_main_thread_streams

        release_main_thread_streams()


@pytest.fixture(autouse=True)
def root_logger_as_it_was():
    """A test that runs ``serve`` in-process configures the root logger with a handler on that
    test's captured stderr, closed once the test ends: later tests' log lines would each fail to
    write and print the failure with its whole call stack. The root logger is put back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(autouse=True)
def no_api_keys_from_the_shell(monkeypatch):
    """Servers in tests read $VLLM_MLX_TRIO_API_KEYS; a developer's own must not turn auth on."""
    from vllm_mlx_trio.config import API_KEYS_ENV

    monkeypatch.delenv(API_KEYS_ENV, raising=False)


@pytest.fixture(scope="session")
def demo_cache_dir(tmp_path_factory) -> str:
    """Where the demo model is built: shared across runs when VLLM_MLX_TRIO_CACHE_DIR is set."""
    env = os.environ.get("VLLM_MLX_TRIO_CACHE_DIR")
    if env:
        return str(pathlib.Path(env) / "demo")
    return str(tmp_path_factory.mktemp("demo-cache"))


@pytest.fixture
def fake_cfg():
    from vllm_mlx_trio.config import load_config

    return load_config(None, overrides=["server.port=0", "server.drain_timeout_s=5"], environ={})


#: The random demo most tests run: config/demo.toml serves the real demo:smollm2, which is far
#: slower on a CPU; tests/real/ runs that one.
TEST_MODEL = "demo:tiny"


@pytest.fixture
def demo_cfg(demo_cache_dir):
    """config/demo.toml with the tiny random demo, on a free port."""
    overrides = ["server.port=0", "server.drain_timeout_s=5", f"model.demo_cache_dir={demo_cache_dir}"]
    from vllm_mlx_trio.config import load_config

    return load_config(REPO / "config" / "demo.toml", overrides=[*overrides, f"model.path={TEST_MODEL}"], environ={})


@pytest.fixture(scope="session")
def float32_dir(tmp_path_factory) -> str:
    """The tiny demo model in float32, built once: a greedy row's tokens then do not depend
    on what else is in the batch."""
    from vllm_mlx_trio.worker.demo import build_demo_model  # imports mlx

    return str(build_demo_model(tmp_path_factory.mktemp("f32") / "tiny", size="tiny", dtype="float32"))
