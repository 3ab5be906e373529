"""The local HTTP server and fake network of the URL-fetching tests."""

from __future__ import annotations

import socket
import time
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

from media_helpers import image_bytes, loader

from vllm_mlx_trio.media.fetch import direct_connector

PNG = image_bytes((5, 4))
#: A documentation-range public address the patched resolver gives public.example.
PUBLIC_IP = "93.184.216.34"
#: A public address nobody answers at (the patched connector refuses it).
DEAD_IP = "93.184.216.35"
#: Far past any deadline the tests set, far below the 30 s a drip lasts: a fetch still running then hangs.
HANG_S = 15.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    hosts: list[str] = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        Handler.hosts.append(self.headers.get("Host", ""))
        parts = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        route = getattr(self, "route_" + parts.path.strip("/").replace("-", "_"), None)
        if route is None:
            self.send_error(404)
            return
        try:
            route(query)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the fetcher stopped reading: what several tests want

    def route_img(self, query):
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def route_redirect(self, query):
        self.send_response(int(query.get("status", 302)))
        self.send_header("Location", query["to"])
        self.end_headers()

    def route_loop(self, query):
        self.send_response(302)
        self.send_header("Location", "/loop")
        self.end_headers()

    def route_big(self, query):
        """A body declared larger than any test's limit."""
        self.send_response(200)
        self.send_header("Content-Length", str(10**9))
        self.end_headers()
        self.wfile.write(b"\0" * 1024)

    def route_endless(self, query):
        """No Content-Length, and a body that never ends: only a streaming limit stops it."""
        self.send_response(200)
        self.end_headers()
        for _ in range(100_000):  # ~6 GB at most; the fetcher hangs up long before
            self.wfile.write(b"\0" * 65536)

    def route_drip(self, query):
        """One byte at a time, each well within any per-read timeout, for 30 s in all."""
        self.send_response(200)
        self.end_headers()
        for _ in range(300):
            self.wfile.write(b"\0")
            self.wfile.flush()
            time.sleep(0.1)

    def route_drip_headers(self, query):
        self.wfile.write(b"HTTP/1.0 200 OK\r\n")
        for _ in range(300):
            self.wfile.write(b"X")
            self.wfile.flush()
            time.sleep(0.1)


class Network:
    """A fake DNS (name -> addresses) and a connector that records every address connected
    to and sends the fake public address to the local server."""

    def __init__(self, server, names: dict[str, list[str]]):
        self.port = server.server_address[1]
        self.names = names
        self.lookups: list[str] = []
        self.connected: list[str] = []

    def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        if host not in self.names:
            raise socket.gaierror(f"unknown host {host}")
        return self.names[host]

    def connect(self, ip: str, port: int, timeout_s: float) -> socket.socket:
        self.connected.append(ip)
        if ip == DEAD_IP:
            raise ConnectionRefusedError(ip)
        if ip == PUBLIC_IP:
            return direct_connector("127.0.0.1", self.port, timeout_s)
        return direct_connector(ip, port, timeout_s)

    def loader(self, **options):
        return loader(resolver=self.resolve, connector=self.connect, **options)
