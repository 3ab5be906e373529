"""The engine's health: whether it works, and whether a shutdown drain has begun.

When the executor dies (a forward pass raises, the MLX thread stops) the engine does not
crash at once: the scheduler fails every request it holds with the cause (open streams get
it in-band), new requests are refused (503), ``/health`` says so, the HTTP server drains,
and then ``open_engine`` raises the cause so the process exits non-zero.

One owner, :class:`EngineHealth`, keeps both facts. The parts that learn one send it a
report (:class:`EngineFailed` from the executor's supervision in ``actors/topology.py`` and
from the scheduler, :class:`DrainStarted` from the facade); everyone else reads a frozen
:class:`HealthSnapshot` or waits for the failure (the scheduler wakes on it, never polls).
"""

from __future__ import annotations

import logging
from typing import TypeAlias, assert_never

import attrs
import trio

from .errors import VllmMlxTrioError

logger = logging.getLogger(__name__)

_frozen = attrs.frozen(slots=True, kw_only=True)


@_frozen
class EngineFailed:
    """The engine stopped working, because of ``error``. The first report is the cause; later
    ones are its consequences and change nothing."""

    error: VllmMlxTrioError


@_frozen
class DrainStarted:
    """A shutdown has begun: new requests are refused, the ones inside go on."""


HealthReport: TypeAlias = EngineFailed | DrainStarted


@_frozen
class HealthSnapshot:
    """The engine's health at one moment: ``error`` is None while it works."""

    error: VllmMlxTrioError | None = None
    draining: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def status(self) -> str:
        """``/health``'s word for it: failed, draining or ok."""
        if self.error is not None:
            return "failed"
        return "draining" if self.draining else "ok"


class EngineHealth:
    """The owner of the engine's health. It changes only by :meth:`report`, applied at once
    (the cause is recorded before anything else runs); it is read as :meth:`snapshot` or
    awaited with :meth:`wait_failed`."""

    def __init__(self) -> None:
        self._now = HealthSnapshot()
        self._failed = trio.Event()

    def report(self, report: HealthReport) -> None:
        match report:
            case EngineFailed(error=error):
                if self._now.error is None:
                    logger.error("engine failed: %s", error)
                    self._now = attrs.evolve(self._now, error=error)
                    self._failed.set()
            case DrainStarted():
                self._now = attrs.evolve(self._now, draining=True)
            case _:
                assert_never(report)

    def snapshot(self) -> HealthSnapshot:
        return self._now

    async def wait_failed(self) -> VllmMlxTrioError:
        """Wait until the engine has failed (at once if it has); the cause."""
        await self._failed.wait()
        assert self._now.error is not None
        return self._now.error
