"""The reading end of the streamed ceiling: a socket on this machine whose connections are read
to their end on a thread, every SSE event parsed as a streaming client parses it.

``CeilingProcess.single_streamed`` has the ceiling's child write each token of ``generate_step``
as its own event to a connection made here, one per prompt; the sink counts each connection's
content events, so a run that lost tokens on the way is seen.
"""

from __future__ import annotations

import json
import socket
import threading

#: Seconds the sink waits for the child's next connection or bytes before it gives up.
IDLE_TIMEOUT_S = 300.0
#: Bytes read at once from a connection.
READ_SIZE = 65536


class SseSink:
    """Listens on 127.0.0.1 (``port``) for ``connections`` connections, read one after another
    on a thread; ``events`` holds each one's count of content events. Use it with ``with``."""

    def __init__(self, connections: int):
        self._expected = connections
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(IDLE_TIMEOUT_S)
        self.port: int = self._listener.getsockname()[1]
        self.events: list[int] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read_all, name="ceiling-sse-sink", daemon=True)

    def __enter__(self) -> SseSink:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        """Wait for the reader, which still reads the last connection after its writer is
        done; on an error, stop it first (closing the listener ends a wait for a connection)."""
        if exc_type is not None:
            self._listener.close()
        self._thread.join(IDLE_TIMEOUT_S)
        self._listener.close()

    def _read_all(self) -> None:
        try:
            for _ in range(self._expected):
                conn, _address = self._listener.accept()
                with conn:
                    conn.settimeout(IDLE_TIMEOUT_S)
                    self.events.append(count_content_events(conn))
        except OSError as exc:  # the listener closed early, or a timeout: the caller reports it
            self.error = exc


def count_content_events(conn: socket.socket) -> int:
    """Read ``conn`` to its end; the number of events whose first choice carries content."""
    pending, count = b"", 0
    while data := conn.recv(READ_SIZE):
        *events, pending = (pending + data).split(b"\n\n")
        for event in events:
            payload = event.removeprefix(b"data: ")
            if payload != b"[DONE]" and json.loads(payload)["choices"][0]["delta"].get("content") is not None:
                count += 1
    return count
