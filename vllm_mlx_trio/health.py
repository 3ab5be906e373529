"""The engine's health: one failure, recorded once, that every layer can see.

When the executor dies (a forward pass raises, the MLX thread stops) the engine does not
crash at once: the scheduler fails every request it holds with the cause (open streams get
it in-band), new requests are refused (503), ``/health`` says so, the HTTP server drains,
and then ``open_engine`` raises the cause so the process exits non-zero.

The supervision that records an executor's failure here is part of the engine's wiring
(``actors/topology.py``); the scheduler wakes on ``failed`` (it never polls ``error``).
"""

from __future__ import annotations

import logging

import trio

from .errors import VllmMlxTrioError

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
