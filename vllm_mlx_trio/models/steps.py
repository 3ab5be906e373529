"""How the MLX threads of several loaded models share the machine (``server.model_steps``).

Every loaded model is an engine with its own MLX thread. "concurrent": each thread steps
whenever its model has work. "exclusive": one process-wide lock around every step (and every
embedding batch), so one model computes at a time and the others' threads wait for it.
docs/architecture.md gives the measurement behind the default.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..config import EngineConfig
from ..engine import Engine, open_engine
from ..worker.registry import RUNNERS, RunnerTable, runner_for

#: The runner methods that compute: each runs under the lock in "exclusive" mode.
_COMPUTING = frozenset({"execute", "run_jobs"})


class ExclusiveRunner:
    """A runner whose steps hold ``lock``; everything else goes to the runner inside."""

    def __init__(self, inner: Any, lock: threading.Lock):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_lock", lock)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if name not in _COMPUTING:
            return value

        def locked(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return value(*args, **kwargs)

        return locked

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)  # the executor sets ``publish`` on the runner


def exclusive_executor_factory(cfg: EngineConfig, lock: threading.Lock, runners: RunnerTable = RUNNERS):
    """The MLX executor for ``cfg`` with its runner's steps under ``lock``."""

    def build(plan_recv, result_send):
        from ..actors.executor import ExecutorActor

        runner_class = runner_for(cfg, runners)
        return ExecutorActor(
            plan_recv=plan_recv,
            result_send=result_send,
            runner_factory=lambda request_waiting: ExclusiveRunner(
                runner_class(cfg, request_waiting=request_waiting), lock
            ),
        )

    return build


def engine_opener(server_cfg: EngineConfig) -> Callable[[EngineConfig], contextlib.AbstractAsyncContextManager[Engine]]:
    """Opens each model's engine as ``server.model_steps`` says."""
    if server_cfg.server.model_steps == "concurrent":
        return open_engine
    lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def open_exclusive(cfg: EngineConfig) -> AsyncIterator[Engine]:
        async with open_engine(cfg, executor_factory=exclusive_executor_factory(cfg, lock)) as engine:
            yield engine

    return open_exclusive
