"""Helpers to run the real engine, or the whole server, on a :class:`FakeExecutor` inside a test."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from ..config import EngineConfig, load_config
from ..engine import Engine, open_engine
from ..local_server import LocalServer, open_local_server
from ..worker.registry import RUNNERS, RunnerTable
from .fake_executor import FakeExecutor, SlowLoadingExecutor, TokenScript, text_script


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
    cfg: EngineConfig | None = None,
    *,
    overrides: tuple[str, ...] = (),
    runners: RunnerTable = RUNNERS,
    **fake_kwargs: Any,
) -> AsyncIterator[FakeEngine]:
    """``open_engine`` on a FakeExecutor built with ``fake_kwargs`` (script, gate, step_s...); the scheduler drives
    it as the configured kind of ``runners`` says."""
    cfg = cfg or load_config(None, overrides=overrides, environ={})
    holder: list[FakeExecutor] = []

    def factory(plan_recv, result_send):
        holder.append(FakeExecutor(plan_recv, result_send, **fake_kwargs))
        return holder[0]

    async with open_engine(cfg, executor_factory=factory, runners=runners) as engine:
        yield FakeEngine(engine=engine, executor=holder[0])


#: The public :func:`open_local_server` (the URL and the engine), under the tests' name.
open_server = open_local_server


def fake_executor_factory(*, executors: list[FakeExecutor] | None = None, **fake_kwargs: Any):
    """An executor factory for :func:`open_engine` / :func:`serve` building a FakeExecutor;
    each one built is appended to ``executors`` when given (to read its plans afterwards)."""

    def factory(plan_recv, result_send):
        executor = FakeExecutor(plan_recv, result_send, **fake_kwargs)
        if executors is not None:
            executors.append(executor)
        return executor

    return factory


#: What a :func:`fake_server` generates unless told otherwise.
FAKE_TEXT = "Hello, world!"


def fake_server(
    cfg: EngineConfig,
    text: str = FAKE_TEXT,
    *,
    then_eos: bool = True,
    script: TokenScript | None = None,
    executors: list[FakeExecutor] | None = None,
    **fake_kwargs: Any,
) -> contextlib.AbstractAsyncContextManager[LocalServer]:
    """The real HTTP server on 127.0.0.1 (``cfg``'s port; 0 picks a free one) over a
    FakeExecutor: ``async with fake_server(cfg) as srv`` gives its ``srv.url`` and ``srv.engine``.

    Every request generates ``text`` then EOS (``then_eos=False``: ``text`` over and over), or
    follows ``script`` when given. Steps take 1 ms unless ``step_s`` says otherwise; the other
    keywords go to :class:`FakeExecutor` (``gate``, ``tokens_per_step``...) and ``executors``
    to :func:`fake_executor_factory`.
    """
    fake_kwargs.setdefault("step_s", 0.001)
    script = script or text_script(text, then_eos=then_eos)
    factory = fake_executor_factory(executors=executors, script=script, **fake_kwargs)
    return open_server(cfg, executor_factory=factory)


def slow_loading_factory(loading: trio.Event, loaded: trio.Event, **fake_kwargs: Any):
    """An executor factory whose model load sets ``loading`` when it begins and lasts until
    ``loaded`` is set (:class:`SlowLoadingExecutor`).

    :func:`~vllm_mlx_trio.serve.serve` on a fixed port opens the engine only once its loading
    app listens: from ``loading`` on, that app answers on the port.
    """

    def factory(plan_recv, result_send):
        return SlowLoadingExecutor(plan_recv, result_send, loaded=loaded, loading=loading, **fake_kwargs)

    return factory
