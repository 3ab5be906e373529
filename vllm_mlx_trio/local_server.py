"""``open_local_server(cfg)``: the engine and the HTTP server in this Trio program, for code
that needs both the URL and the engine (the benchmarks measure one and inspect the other).

It is :func:`open_engine` plus :func:`serve_engine`, the two public pieces :func:`serve`
is made of (without ``serve``'s "loading" phase: use ``server.port = 0`` for a free port).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import attrs
import trio

from .config import EngineConfig
from .engine import Engine, ExecutorFactory, open_engine
from .serve import serve_engine


@attrs.define
class LocalServer:
    """A running server: its base URL and the engine behind it."""

    url: str
    engine: Engine


@contextlib.asynccontextmanager
async def open_local_server(
    cfg: EngineConfig, *, executor_factory: ExecutorFactory | None = None
) -> AsyncIterator[LocalServer]:
    """Serve ``cfg`` until the block is left; leaving it drains the server and waits for that."""
    stop = trio.Event()
    async with open_engine(cfg, executor_factory=executor_factory) as engine:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                lambda task_status: serve_engine(engine, shutdown_trigger=stop.wait, task_status=task_status)
            )
            try:
                yield LocalServer(url=binds[0], engine=engine)
            finally:
                stop.set()
