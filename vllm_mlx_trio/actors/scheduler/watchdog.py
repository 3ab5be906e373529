"""The step watchdog: one task that notices when the executor edge stops moving.

A model step that never returns (a hung kernel, a deadlocked thread) must not leave clients
waiting forever: after ``timeout_s`` without progress while a plan is in flight, the
watchdog calls ``on_stall`` once and returns. One task with one deadline, so the per-step
path only stamps :meth:`StepWatchdog.progress` and carries no timer of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import trio


class StepWatchdog:
    """``busy()`` says whether a plan is outstanding; ``progress()`` is called whenever the
    edge moves (a plan taken, a result back)."""

    def __init__(self, timeout_s: float, *, busy: Callable[[], bool], on_stall: Callable[[], None]):
        self.timeout_s = timeout_s
        self._busy = busy
        self._on_stall = on_stall
        self._last_progress = trio.current_time()

    def progress(self) -> None:
        self._last_progress = trio.current_time()

    async def run(self) -> None:
        """Sleep until the deadline of the last progress; at it, a busy edge that has not
        moved is a stall. While idle the deadline keeps moving with the clock."""
        while True:
            waiting_since = self._last_progress
            await trio.sleep_until(waiting_since + self.timeout_s)
            busy = self._busy()
            if busy and self._last_progress == waiting_since:
                self._on_stall()
                return
            if not busy:
                self._last_progress = max(self._last_progress, trio.current_time())
