"""A lean HTTP/1.1 client for the benches' streamed requests: each ``data:`` line as it arrives.

On a machine with few cores the client shares the CPU with the server it measures, so what the
client spends per token comes out of the server's figures. httpx's async stream wakes an event
loop for every chunk and reads it through several layers of decoders, about 0.16 ms of CPU per
streamed token on a 2-core x86 machine; this client reads each response with blocking reads on a
worker thread, undoes chunked framing and splits lines, about 0.06 ms. It speaks just what the
benches need: a POST with a JSON body over ``http://`` (or ``https://``), a response framed by
``Transfer-Encoding: chunked``, ``Content-Length`` or the connection's end, and connections kept
alive between requests (one pool per server) when the server allows.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

import attrs
import trio

from ..errors import VllmMlxTrioError

#: Bytes asked of the socket per read: many streamed chunks at once when the client falls behind.
READ_SIZE = 65536
#: Most bytes of a response head: far above any server's status line and headers.
MAX_HEAD_BYTES = 65536


class StreamProtocolError(VllmMlxTrioError):
    """The server's response is not HTTP/1.1 this client can read."""


@attrs.frozen
class ResponseHead:
    status: int
    headers: dict[str, str]
    #: ``HTTP/1.0`` or ``HTTP/1.1``.
    version: str = "HTTP/1.1"

    @property
    def keep_alive(self) -> bool:
        """Whether the server keeps the connection: HTTP/1.1 unless it says ``close``, HTTP/1.0
        only when it says ``keep-alive``."""
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


def parse_head(raw: bytes) -> ResponseHead:
    """The status and headers (names lowercased) of a response head, without its blank line."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise StreamProtocolError(f"not an HTTP/1.x status line: {lines[0]!r}")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return ResponseHead(int(parts[1]), headers, parts[0])


class ChunkedDecoder:
    """Undoes ``Transfer-Encoding: chunked`` incrementally: ``feed`` the bytes as they come,
    get the payload back; ``done`` once the last chunk and the trailer have come."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._left = 0  # payload bytes of the current chunk still to come
        self._state = "size"
        self.done = False

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        while not self.done and self._advance(out):
            pass
        return bytes(out)

    def _advance(self, out: bytearray) -> bool:
        """One move of the state machine; False: it needs more bytes."""
        buffer = self._buffer
        if self._state == "data":
            if not buffer:
                return False
            piece = buffer[: self._left]
            out += piece
            del buffer[: len(piece)]
            self._left -= len(piece)
            if not self._left:
                self._state = "data_end"
            return True
        if self._state == "data_end":
            if len(buffer) < 2:
                return False
            del buffer[:2]
            self._state = "size"
            return True
        end = buffer.find(b"\r\n")
        if end < 0:
            return False
        line = bytes(buffer[:end])
        del buffer[: end + 2]
        if self._state == "trailer":
            self.done = not line
            return True
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise StreamProtocolError(f"bad chunk size line: {line[:40]!r}") from None
        self._state, self._left = ("data", size) if size else ("trailer", 0)
        return True


class _Body:
    """The payload of one response, framed as its head says; ``complete`` once all of it came."""

    def __init__(self, head: ResponseHead):
        chunked = "chunked" in head.headers.get("transfer-encoding", "").lower()
        self._chunked = ChunkedDecoder() if chunked else None
        length = head.headers.get("content-length")
        self._left = int(length) if length is not None and not chunked else None
        self.until_close = self._chunked is None and self._left is None

    @property
    def complete(self) -> bool:
        if self._chunked is not None:
            return self._chunked.done
        return self._left is not None and self._left <= 0

    def feed(self, data: bytes) -> bytes:
        if self._chunked is not None:
            return self._chunked.feed(data)
        if self._left is not None:
            data = data[: self._left]
            self._left -= len(data)
        return data


class SseConnections:
    """Kept-alive connections to one server, for streamed POSTs, each read on a worker thread.

    A request runs on a thread of its own (``trio.to_thread``) with blocking reads: a token's
    arrival costs one ``recv`` and no event loop's wake-up. ``on_line`` is called on that thread."""

    def __init__(self, base_url: str, *, read_timeout_s: float = 600.0, max_streams: int = 64):
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise StreamProtocolError(f"not an http:// or https:// address: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        #: Longest wait for the next bytes of a response.
        self.read_timeout_s = read_timeout_s
        self._threads = trio.CapacityLimiter(max_streams)
        #: Connections free for the next request (``list.append`` and ``pop`` are atomic).
        self._idle: list[socket.socket] = []

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def post(self, path: str, body: dict, on_line: Callable[[bytes], None]) -> tuple[int, bytes]:
        """POST ``body`` as JSON. A 200's body goes to ``on_line`` a line at a time (without its
        line end) as it arrives: ``(200, b"")``. Any other status: ``(status, its body)``."""
        payload = self._request(path, json.dumps(body).encode())
        return await trio.to_thread.run_sync(
            self._post, payload, on_line, limiter=self._threads, abandon_on_cancel=True
        )

    def _post(self, payload: bytes, on_line: Callable[[bytes], None]) -> tuple[int, bytes]:
        sock, head, rest = self._send(payload)
        reusable = False
        try:
            error_body = bytearray()
            sink = on_line if head.status == 200 else (lambda line: error_body.extend(line + b"\n"))
            framing = _read_body(sock, _Body(head), rest, sink)
            reusable = framing.complete and head.keep_alive
            return head.status, bytes(error_body)
        finally:
            if reusable:
                self._idle.append(sock)
            else:
                sock.close()

    def _send(self, payload: bytes) -> tuple[socket.socket, ResponseHead, bytes]:
        """Send the request on a kept connection, or a new one if there is none or the kept one
        turns out closed by the server: the socket, the response head and the body bytes read
        with it."""
        while True:
            try:
                sock = self._idle.pop()
            except IndexError:
                break
            try:
                sock.sendall(payload)
                head, rest = _read_head(sock)
            except (OSError, StreamProtocolError):
                sock.close()
                continue
            return sock, head, rest
        sock = self._connect()
        try:
            sock.sendall(payload)
            head, rest = _read_head(sock)
        except BaseException:
            sock.close()
            raise
        return sock, head, rest

    def _connect(self) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout=self.read_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_hostname=self.host)
        return sock

    def _request(self, path: str, payload: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode("latin-1") + payload


def _read_body(sock: socket.socket, framing: _Body, data: bytes, on_line: Callable[[bytes], None]) -> _Body:
    """Read the body to its end, handing each line to ``on_line`` as it completes."""
    pending = b""
    while True:
        pending += framing.feed(data)
        if b"\n" in pending:
            *lines, pending = pending.split(b"\n")
            for line in lines:
                on_line(line[:-1] if line.endswith(b"\r") else line)
        if framing.complete:
            break
        data = _receive(sock)
        if not data:
            if not framing.until_close:
                raise StreamProtocolError("the server closed the connection inside a response")
            break
    if pending:
        on_line(pending[:-1] if pending.endswith(b"\r") else pending)
    return framing


def _read_head(sock: socket.socket) -> tuple[ResponseHead, bytes]:
    """The response head, and the body bytes read with it; a ``100 Continue`` is skipped."""
    buffer = bytearray()
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            head = parse_head(bytes(buffer[:end]))
            del buffer[: end + 4]
            if head.status == 100:
                continue
            return head, bytes(buffer)
        if len(buffer) > MAX_HEAD_BYTES:
            raise StreamProtocolError("the response head is too long")
        data = _receive(sock)
        if not data:
            raise StreamProtocolError("the server closed the connection before answering")
        buffer += data


def _receive(sock: socket.socket) -> bytes:
    try:
        return sock.recv(READ_SIZE)
    except TimeoutError:
        raise StreamProtocolError(f"the server sent nothing for {sock.gettimeout():g} s") from None
