"""Helpers to run the real engine on a :class:`FakeExecutor` inside a test."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import attrs

from ..config import EngineConfig, load_config
from ..engine import Engine, open_engine
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


@attrs.define
class TestServer:
    """A running server: its base URL and the engine behind it."""

    url: str
    engine: Engine


@contextlib.asynccontextmanager
async def open_server(cfg: EngineConfig, *, executor_factory: Any = None) -> AsyncIterator[TestServer]:
    """Serve ``cfg`` (use ``server.port = 0`` for a free port) until the block is left.

    Leaving the block triggers the graceful shutdown and waits for it.
    """
    import trio

    from ..serve import serve_engine

    stop = trio.Event()
    async with open_engine(cfg, executor_factory=executor_factory) as engine:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve_engine(engine, shutdown_trigger=stop.wait, task_status=task_status)
            )
            try:
                yield TestServer(url=binds[0], engine=engine)
            finally:
                stop.set()


def fake_executor_factory(**fake_kwargs: Any):
    """An executor factory for :func:`open_engine` / :func:`serve` building a FakeExecutor."""

    def factory(plan_recv, result_send):
        return FakeExecutor(plan_recv, result_send, **fake_kwargs)

    return factory
