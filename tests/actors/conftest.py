"""Fixtures shared by the actor tests."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.testing.fake_runner import BlockingRunner
from vllm_mlx_trio.worker.registry import with_runner


@pytest.fixture
def blocking_kind():
    """(name, runner table) of a kind whose first step blocks (``BlockingRunner``)."""
    yield "fake-blocking", with_runner("fake-blocking", BlockingRunner)
    for runner in BlockingRunner.instances:
        runner.release.set()  # let an abandoned thread finish
    BlockingRunner.instances.clear()
