"""Fixtures shared by the actor tests."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.testing.fake_runner import BlockingRunner
from vllm_mlx_trio.worker.registry import RUNNERS, register_runner


@pytest.fixture
def blocking_kind():
    """The name of a registered kind whose first step blocks (``BlockingRunner``)."""
    register_runner("fake-blocking", BlockingRunner)
    yield "fake-blocking"
    del RUNNERS["fake-blocking"]
    for runner in BlockingRunner.instances:
        runner.release.set()  # let an abandoned thread finish
    BlockingRunner.instances.clear()
