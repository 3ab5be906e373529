"""Fetch a media URL without letting a request reach the server's own network (SSRF).

For each hop: http(s) only; the host is resolved here (within the deadline) and *every*
address it resolves to must pass :func:`.addresses.forbidden_reason` (unless private URLs are
allowed); the connection goes to the address that was checked (no second lookup, so DNS
rebinding cannot swap it), with the host name kept for ``Host``, SNI and certificate checks.
Redirects are followed here, each hop checked again. The body is read in chunks and refused
as soon as it passes the limit. One total deadline covers resolving, connecting, headers and
body: a watchdog shuts the socket down when it passes, so a server that drips a byte at a
time cannot hold the request past ``fetch_timeout_s``.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable
from urllib.parse import urljoin, urlsplit

from .addresses import forbidden_reason, parse_address
from .loaded import refuse

#: host, port -> the IP addresses (text) the host resolves to.
Resolver = Callable[[str, int], list[str]]
#: ip, port, timeout_s -> a connected socket.
Connector = Callable[[str, int, float], socket.socket]

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: Bytes asked for per read of the body (a read returns what has arrived, up to this).
FETCH_CHUNK = 64 * 1024
USER_AGENT = "vllm-mlx-trio media fetch"


class _Expired(Exception):
    """The total deadline passed."""


def system_resolver(host: str, port: int) -> list[str]:
    return [info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)]


def direct_connector(ip: str, port: int, timeout_s: float) -> socket.socket:
    return socket.create_connection((ip, port), timeout=timeout_s)


def fetch_url(
    url: str,
    *,
    where: str,
    max_bytes: int,
    timeout_s: float,
    max_redirects: int,
    allow_private: bool,
    resolver: Resolver | None = None,
    connector: Connector | None = None,
) -> bytes:
    """The body of ``url`` (after at most ``max_redirects`` redirects), or a 400 naming ``where``."""
    deadline = time.monotonic() + timeout_s
    hop = _Hop(where, max_bytes, deadline, allow_private, resolver or system_resolver, connector or direct_connector)
    too_slow = f"fetching the URL took longer than {timeout_s:g} s (mllm.fetch_timeout_s)."
    for _ in range(max_redirects + 1):
        try:
            status, body, location = hop.get(url)
        except _Expired:
            raise refuse(where, too_slow) from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            reason = (
                too_slow if time.monotonic() >= deadline else f"the URL could not be fetched ({type(exc).__name__})."
            )
            raise refuse(where, reason) from None
        if status not in REDIRECT_STATUSES:
            if status != 200:
                raise refuse(where, f"the URL answered HTTP {status}.")
            return body
        if not location:
            raise refuse(where, f"the URL answered HTTP {status} without a Location.")
        url = urljoin(url, location)
    raise refuse(where, f"the URL redirected more than {max_redirects} times (mllm.max_redirects).")


class _Hop:
    """One request of a fetch: check the URL and its addresses, connect, read the answer."""

    def __init__(
        self,
        where: str,
        max_bytes: int,
        deadline: float,
        allow_private: bool,
        resolver: Resolver,
        connector: Connector,
    ) -> None:
        self.where, self.max_bytes, self.deadline = where, max_bytes, deadline
        self.allow_private, self.resolver, self.connector = allow_private, resolver, connector

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _Expired
        return left

    def get(self, url: str) -> tuple[int, bytes, str | None]:
        """(status, body, Location) of one GET; a redirect's body is not read."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise refuse(self.where, "only http(s) URLs with a host can be fetched.")
        port = parts.port or (443 if parts.scheme == "https" else 80)  # a bad port: ValueError
        ips = self.checked_addresses(parts.hostname, port)
        conn = _connection(parts.scheme, parts.hostname, port, ips, self.remaining(), self.connector)
        watchdog = threading.Timer(self.remaining(), _shut_down, (conn,))
        watchdog.daemon = True
        watchdog.start()
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            headers = {"User-Agent": USER_AGENT, "Accept": "image/*, video/*", "Accept-Encoding": "identity"}
            conn.request("GET", target, headers=headers)
            response = conn.getresponse()
            if response.status in REDIRECT_STATUSES:
                return response.status, b"", response.getheader("Location")
            return response.status, self.read_body(response), None
        finally:
            watchdog.cancel()
            conn.close()
            self.remaining()  # a read cut short by the watchdog is a timeout, not a short body

    def checked_addresses(self, host: str, port: int) -> tuple[str, ...]:
        """The addresses to connect to, in the resolver's order: the literal, or every address
        the host resolves to, once each of them passed the SSRF rule."""
        literal = parse_address(host)
        addresses = [host] if literal is not None else _resolve_within(self.resolver, host, port, self.remaining())
        if not addresses:
            raise refuse(self.where, "the URL's host has no address.")
        for text in addresses:
            address = parse_address(text)
            if address is None:  # only a custom resolver can say so: never looked up a second time
                raise refuse(self.where, "the URL's host did not resolve to IP addresses.")
            reason = forbidden_reason(address)
            if reason is not None and not self.allow_private:
                raise refuse(
                    self.where,
                    f"the URL's host resolves to {reason}, which this server does not fetch from "
                    "(mllm.allow_private_urls).",
                )
        return tuple(addresses)

    def read_body(self, response: http.client.HTTPResponse) -> bytes:
        length = response.getheader("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise refuse(self.where, f"the URL's body is {int(length)} bytes, more than the limit of {self.max_bytes}.")
        chunks, total = [], 0
        while True:
            self.remaining()
            chunk = response.read1(FETCH_CHUNK)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > self.max_bytes:
                raise refuse(self.where, f"the URL's body is over the limit of {self.max_bytes} bytes.")
            chunks.append(chunk)


def _resolve_within(resolver: Resolver, host: str, port: int, timeout_s: float) -> list[str]:
    """``resolver(host, port)`` in a daemon thread, given up after ``timeout_s`` (getaddrinfo
    has no timeout of its own)."""
    result: list = []
    done = threading.Event()

    def work() -> None:
        try:
            result.append(resolver(host, port))
        except (OSError, UnicodeError) as exc:
            result.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="media-resolve", daemon=True).start()
    if not done.wait(timeout_s):
        raise _Expired
    if isinstance(result[0], Exception):
        raise result[0]
    return list(result[0])


def _connection(scheme: str, host: str, port: int, ips: tuple[str, ...], timeout_s: float, connector: Connector):
    cls = _PinnedHTTPS if scheme == "https" else _PinnedHTTP
    return cls(host, port, ips=ips, timeout=timeout_s, connector=connector)


def _connect_first(ips: tuple[str, ...], port: int, timeout_s: float, connector: Connector) -> socket.socket:
    """A socket to the first of ``ips`` that accepts (as ``create_connection`` tries a name's addresses)."""
    error: OSError | None = None
    for ip in ips:
        try:
            return connector(ip, port, timeout_s)
        except OSError as exc:
            error = exc
    raise error if error is not None else OSError("no address to connect to")


class _PinnedHTTP(http.client.HTTPConnection):
    """Connects to the checked address; ``Host`` stays the URL's host."""

    def __init__(self, host: str, port: int, *, ips: tuple[str, ...], timeout: float, connector: Connector):
        super().__init__(host, port, timeout=timeout)
        self._ips, self._connector = ips, connector

    def connect(self) -> None:
        self.sock = _connect_first(self._ips, self.port, self.timeout, self._connector)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """As :class:`_PinnedHTTP`, with TLS verified against the URL's host name."""

    def __init__(self, host: str, port: int, *, ips: tuple[str, ...], timeout: float, connector: Connector):
        super().__init__(host, port, timeout=timeout, context=ssl.create_default_context())
        self._ips, self._connector = ips, connector

    def connect(self) -> None:
        sock = _connect_first(self._ips, self.port, self.timeout, self._connector)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def _shut_down(conn: http.client.HTTPConnection) -> None:
    """The watchdog: end every blocked read on the connection (the socket's own shutdown, not
    TLS's, so it is safe while another thread reads)."""
    sock = conn.sock
    if sock is not None:
        try:
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already closed
