"""The engine's health: one failure, recorded once, that every layer can see.

When the executor dies (a forward pass raises, the MLX thread stops) the engine does not
crash at once: the scheduler fails every request it holds with the cause (open streams get
it in-band), new requests are refused (503), ``/health`` says so, the HTTP server drains,
and then ``open_engine`` raises the cause so the process exits non-zero.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .errors import ExecutorCrashedError, VllmMlxTrioError

logger = logging.getLogger(__name__)


class EngineHealth:
    """``error`` is None while the engine works; ``failed`` is set when it stops working."""

    def __init__(self) -> None:
        self.error: VllmMlxTrioError | None = None
        self.failed = trio.Event()

    @property
    def ok(self) -> bool:
        return self.error is None

    def fail(self, error: VllmMlxTrioError) -> None:
        """Record the first failure (later ones are consequences of it)."""
        if self.error is None:
            logger.error("engine failed: %s", error)
            self.error = error
            self.failed.set()


class _StartedReporter:
    """A ``task_status`` that remembers whether ``started`` was called."""

    def __init__(self, task_status: trio.TaskStatus[Any]):
        self._task_status = task_status
        self.started_once = False

    def started(self, value: Any = None) -> None:
        self.started_once = True
        self._task_status.started(value)


async def run_supervised(
    run: Callable[..., Awaitable[None]],
    health: EngineHealth,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an actor; once it has started, its failure is recorded in ``health`` instead of
    cancelling its siblings (a failure while starting, such as a model that cannot load,
    still raises at once)."""
    reporter = _StartedReporter(task_status)
    try:
        await run(task_status=reporter)
    except VllmMlxTrioError as exc:
        if not reporter.started_once:
            raise
        health.fail(exc)
    except Exception as exc:  # boundary: any other failure of a running actor ends the engine
        if not reporter.started_once:
            raise
        health.fail(ExecutorCrashedError(f"{type(exc).__name__}: {exc}"))
