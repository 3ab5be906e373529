"""The scheduler's end of the control channel: operator commands, handed to its loop one at a
time so that it acts on each between two steps.

The scheduler owns (and closes) the receive channel; this class moves commands from it to the
loop. A command's one-shot reply channel belongs to whoever holds the command: here, until
the loop has handled it, and then it is closed (answered or not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import trio

from ...messages import ClearPrefixCache, ControlCommand


class ControlInbox:
    """Receives commands in a task of its own (:meth:`receive`); the loop takes the waiting one
    with :meth:`next_command`. Holding one command at a time keeps the channel's buffer the
    only queue: a sender finds it full, instead of a list here growing without bound."""

    def __init__(self, control_recv: trio.MemoryReceiveChannel[ControlCommand], wake: Callable[[], None]):
        self._recv = control_recv
        self._wake = wake
        self._waiting: tuple[ControlCommand, trio.Event] | None = None

    async def receive(self) -> None:
        """Hand each command to the loop (waking it) and wait until the loop has handled it."""
        async for command in self._recv:
            handled = trio.Event()
            self._waiting = (command, handled)
            self._wake()
            await handled.wait()

    @contextlib.contextmanager
    def next_command(self) -> Iterator[ControlCommand | None]:
        """The command waiting for the loop, or None. Leaving the block marks it handled and
        closes its reply channel (a caller still waiting for an answer then hears that none is
        coming)."""
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            yield None
            return
        command, handled = waiting
        try:
            yield command
        finally:
            _close_reply(command)
            handled.set()

    def refuse_all(self) -> None:
        """The scheduler is stopping: close the replies of every command not handled yet (the
        waiting one and those still in the channel's buffer)."""
        with self.next_command():
            pass
        while True:
            try:
                _close_reply(self._recv.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                return


def _close_reply(command: ControlCommand) -> None:
    if isinstance(command, ClearPrefixCache):
        command.reply.close()
