"""Helpers to run the real engine on a :class:`FakeExecutor` inside a test."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import attrs

from ..config import EngineConfig, load_config
from ..engine import Engine, open_engine
from ..local_server import open_local_server
from .fake_executor import FakeExecutor


def free_port() -> int:
    """A TCP port on 127.0.0.1 free just now, for a server that cannot use port 0 (two
    listeners in turn on one port, or a subprocess that cannot report the port back)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@attrs.define
class FakeEngine:
    """An engine plus the fake executor behind it (to inspect plans and live sequences)."""

    engine: Engine
    executor: FakeExecutor


@contextlib.asynccontextmanager
async def open_fake_engine(
    cfg: EngineConfig | None = None, *, overrides: tuple[str, ...] = (), **fake_kwargs: Any
) -> AsyncIterator[FakeEngine]:
    """``open_engine`` on a FakeExecutor built with ``fake_kwargs`` (script, gate, step_s...)."""
    cfg = cfg or load_config(None, overrides=overrides, environ={})
    holder: list[FakeExecutor] = []

    def factory(plan_recv, result_send):
        holder.append(FakeExecutor(plan_recv, result_send, **fake_kwargs))
        return holder[0]

    async with open_engine(cfg, executor_factory=factory) as engine:
        yield FakeEngine(engine=engine, executor=holder[0])


#: The public :func:`open_local_server` (the URL and the engine), under the tests' name.
open_server = open_local_server


def fake_executor_factory(**fake_kwargs: Any):
    """An executor factory for :func:`open_engine` / :func:`serve` building a FakeExecutor."""

    def factory(plan_recv, result_send):
        return FakeExecutor(plan_recv, result_send, **fake_kwargs)

    return factory
