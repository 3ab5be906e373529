"""Hypercorn's connection, writing a response's bytes straight to the socket when it can.

Hypercorn writes every piece of a response through its connection's ``protocol_send``: it takes
the connection's send lock, then awaits ``send_all``. Each of the two is a checkpoint, a pass of
Trio's loop, and every pass waits in ``epoll_wait``, which gives the GIL up to the MLX thread and
then waits to get it back. A stream that sends every token in its own chunk writes once per token,
so on a machine whose cores the model keeps busy those two passes are a large part of a token's
cost (docs/benchmarks.md, *Every token as it is sampled*).

:class:`DirectSendConnection` writes a piece at once when nobody holds the send lock: one
non-blocking write of the socket, no checkpoint. The lock is free, and nothing runs between the
check and the write, so the bytes go out in the order Hypercorn produced them. What the kernel
does not take (its buffer is full: the client reads slower than the server writes), every other
event, and TLS connections go Hypercorn's own way, under the lock. A socket that fails on the
write is left to that way too, which finds the failure and closes the connection as usual.

Hypercorn makes its connections from ``hypercorn.trio.run.TCPServer``; :func:`use_direct_send`
puts this class there (or Hypercorn's own back), for every Hypercorn server of the process.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import hypercorn.trio.run as hypercorn_run
import trio
from hypercorn.events import Event, RawData
from hypercorn.trio.tcp_server import TCPServer

logger = logging.getLogger(__name__)


class DirectSendConnection(TCPServer):
    """A Hypercorn connection whose writes skip the send lock and the loop when they can."""

    async def protocol_send(self, event: Event) -> None:
        if isinstance(event, RawData) and not self.send_lock.locked():
            written = self._write_now(event.data)
            if written == len(event.data):
                return
            event = dataclasses.replace(event, data=event.data[written:])
        await super().protocol_send(event)

    def _write_now(self, data: bytes) -> int:
        """How many bytes of ``data`` the socket took at once: 0 when it took none, when the
        connection is not a plain socket (TLS), or when the write failed."""
        stream = self.stream
        if not isinstance(stream, trio.SocketStream):
            return 0
        fd = stream.socket.fileno()
        if fd < 0:  # closed
            return 0
        try:
            return os.write(fd, data)
        except OSError:  # full (EAGAIN), interrupted, or broken: Hypercorn's own path deals with it
            return 0


def use_direct_send(enabled: bool) -> None:
    """Make Hypercorn's new connections :class:`DirectSendConnection` (``enabled``) or its own
    ``TCPServer``, process-wide. Connections already open keep their class."""
    wanted = DirectSendConnection if enabled else TCPServer
    if hypercorn_run.TCPServer is not wanted:
        logger.debug("Hypercorn connections: %s", wanted.__name__)
        hypercorn_run.TCPServer = wanted
