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
        self.executor_exited = trio.Event()

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
    stop: trio.CancelScope,
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run an actor; once it has started, its failure is recorded in ``health`` instead of
    cancelling its siblings (a failure while starting, such as a model that cannot load,
    still raises at once). ``stop`` is cancelled when a failure is recorded elsewhere (the
    scheduler's watchdog), which stops the actor too: see :func:`cancel_on_failure`.

    The failure is recorded before anything else runs (no checkpoint between the actor's
    exit and the ``except``), so every request fails with the actor's own cause.
    """
    reporter = _StartedReporter(task_status)
    try:
        with stop:
            await run(task_status=reporter)
    except Exception as exc:  # boundary: a running actor's failure becomes the engine's
        if not reporter.started_once:
            raise
        health.fail(_our_error(exc))
    finally:
        health.executor_exited.set()


async def cancel_on_failure(health: EngineHealth, stop: trio.CancelScope) -> None:
    """Cancel ``stop`` if the engine fails; return once the executor has exited either way
    (run in the engine's nursery)."""
    async with trio.open_nursery() as nursery:

        async def on_failure() -> None:
            await health.failed.wait()
            stop.cancel()

        nursery.start_soon(on_failure)
        await health.executor_exited.wait()
        nursery.cancel_scope.cancel()


def _our_error(exc: BaseException) -> VllmMlxTrioError:
    """The first of our errors in ``exc`` (Trio wraps task failures in groups), else a
    translation of ``exc`` into an :class:`ExecutorCrashedError`."""
    if isinstance(exc, VllmMlxTrioError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _our_error(inner)
            if not (type(found) is ExecutorCrashedError and found.__cause__ is inner):
                return found
        return _our_error(exc.exceptions[0])
    error = ExecutorCrashedError(f"{type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
