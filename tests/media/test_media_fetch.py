"""URL fetching against a real HTTP server on 127.0.0.1: the SSRF rule (checked addresses,
no connection to a refused one, redirects re-checked, the checked address is the one
connected to), the size limit while streaming, and the total deadline."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest
from media_helpers import image, image_bytes, loader, prompt

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.media.fetch import direct_connector

PNG = image_bytes((5, 4))
FIRST = "messages[1].content[1]"
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


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def local(server, path: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


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


def refused(load, url: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        load(prompt(image(url)))
    assert caught.value.param == FIRST and caught.value.message.startswith(FIRST)
    return caught.value


def test_a_loopback_url_is_refused_by_default(server):
    net = Network(server, {})
    error = refused(net.loader().load_prompt_media, local(server, "/img"))
    assert "loopback" in error.message and "allow_private_urls" in error.message
    assert net.connected == []


def test_a_loopback_url_loads_with_allow_private_urls(server):
    net = Network(server, {})
    (loaded,) = net.loader(allow_private_urls=True).load_prompt_media(prompt(image(local(server, "/img"))))
    assert loaded.image.size == (5, 4) and net.connected == ["127.0.0.1"]


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://10.1.2.3/a.png", "private"),
        ("http://10.255.255.255:8080/a.png", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/latest/", "metadata"),
        ("http://[::ffff:169.254.169.254]/", "metadata"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),
        ("http://[::1]/", "loopback"),
        ("http://0.0.0.0/", "unspecified"),
        ("http://192.168.0.1/", "private"),
        ("http://100.64.0.1/", "not a public"),
        ("http://224.0.0.1/", "multicast"),
        ("http://[fe80::1]/", "link-local"),
    ],
)
def test_private_and_metadata_literals_are_refused_without_connecting(server, url, words):
    net = Network(server, {})
    assert words in refused(net.loader().load_prompt_media, url).message
    assert net.connected == [] and net.lookups == []


@pytest.mark.parametrize(
    "addresses, words",
    [
        (["10.0.0.7"], "private"),
        (["169.254.169.254"], "metadata"),
        (["127.0.0.1"], "loopback"),
        (["::ffff:10.0.0.7"], "private"),
        ([PUBLIC_IP, "10.0.0.7"], "private"),  # one bad address is enough
    ],
)
def test_a_hostname_resolving_to_a_refused_address_is_refused_without_connecting(server, addresses, words):
    net = Network(server, {"internal.example": addresses})
    assert words in refused(net.loader().load_prompt_media, "http://internal.example/a.png").message
    assert net.lookups == ["internal.example"] and net.connected == []


def test_a_public_hostname_connects_to_the_address_checked(server):
    """One lookup, and the connection goes to that address; Host is still the name."""
    port = server.server_address[1]
    net = Network(server, {"public.example": [PUBLIC_IP]})
    Handler.hosts.clear()
    (loaded,) = net.loader().load_prompt_media(prompt(image(f"http://public.example:{port}/img")))
    assert loaded.image.size == (5, 4)
    assert net.lookups == ["public.example"] and net.connected == [PUBLIC_IP]
    assert Handler.hosts == [f"public.example:{port}"]


def test_the_next_checked_address_is_tried_when_one_refuses(server):
    port = server.server_address[1]
    net = Network(server, {"public.example": [DEAD_IP, PUBLIC_IP]})
    (loaded,) = net.loader().load_prompt_media(prompt(image(f"http://public.example:{port}/img")))
    assert loaded.image.size == (5, 4) and net.connected == [DEAD_IP, PUBLIC_IP]


def test_no_address_accepting_is_a_400(server):
    net = Network(server, {"public.example": [DEAD_IP]})
    assert "ConnectionRefusedError" in refused(net.loader().load_prompt_media, "http://public.example/a.png").message


@pytest.mark.parametrize(
    "target, words",
    [
        ("http://10.0.0.1/a.png", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://internal.example/a.png", "private"),
        ("LOCAL", "loopback"),
        ("file:///etc/passwd", "only http(s)"),
    ],
)
def test_a_redirect_to_a_refused_address_is_refused(server, target, words):
    port = server.server_address[1]
    target = local(server, "/img") if target == "LOCAL" else target
    net = Network(server, {"public.example": [PUBLIC_IP], "internal.example": ["10.9.9.9"]})
    error = refused(net.loader().load_prompt_media, f"http://public.example:{port}/redirect?to={target}")
    assert words in error.message
    assert net.connected == [PUBLIC_IP]


def test_a_redirect_to_a_public_address_is_followed(server):
    port = server.server_address[1]
    net = Network(server, {"public.example": [PUBLIC_IP]})
    url = f"http://public.example:{port}/redirect?status=307&to=/img"
    (loaded,) = net.loader().load_prompt_media(prompt(image(url)))
    assert loaded.image.size == (5, 4) and net.connected == [PUBLIC_IP, PUBLIC_IP]


def test_redirects_are_limited(server):
    net = Network(server, {})
    error = refused(net.loader(allow_private_urls=True, max_redirects=2).load_prompt_media, local(server, "/loop"))
    assert "redirected more than 2" in error.message
    assert len(net.connected) == 3


def test_a_declared_oversize_body_is_refused(server):
    load = loader(allow_private_urls=True, max_image_bytes=4096).load_prompt_media
    assert "limit" in refused(load, local(server, "/big")).message


def test_an_endless_body_stops_at_the_limit(server):
    """Without Content-Length: the read stops at the limit (a whole read would never end;
    it would then hit the timeout instead, and say so)."""
    load = loader(allow_private_urls=True, max_image_bytes=200_000, fetch_timeout_s=20.0).load_prompt_media
    error = refused(load, local(server, "/endless"))
    assert "over the limit of 200000 bytes" in error.message


@pytest.mark.parametrize("path", ["/drip", "/drip-headers"])
def test_a_slow_drip_hits_the_total_deadline(server, path):
    """A byte every 0.1 s never trips a per-read timeout; the total deadline ends it."""
    load = loader(allow_private_urls=True, fetch_timeout_s=0.5).load_prompt_media
    errors: list[InvalidRequestError] = []
    worker = threading.Thread(target=lambda: errors.append(refused(load, local(server, path))), daemon=True)
    worker.start()
    worker.join(HANG_S)
    assert not worker.is_alive(), f"the fetch ran past {HANG_S} s with a 0.5 s deadline (the drip lasts 30 s)"
    assert "took longer than 0.5 s" in errors[0].message


def test_a_slow_resolver_hits_the_total_deadline(server):
    release = threading.Event()

    def stuck(host, port):
        release.wait(30)
        return [PUBLIC_IP]

    try:
        error = refused(loader(resolver=stuck, fetch_timeout_s=0.3).load_prompt_media, "http://slow.example/a.png")
        assert "took longer" in error.message
    finally:
        release.set()


def test_http_errors_and_unknown_hosts_are_400s(server):
    net = Network(server, {})
    assert "HTTP 404" in refused(net.loader(allow_private_urls=True).load_prompt_media, local(server, "/nope")).message
    assert "could not be fetched" in refused(net.loader().load_prompt_media, "http://nowhere.example/a.png").message
    assert "could not be fetched" in refused(net.loader().load_prompt_media, "http://public.example:99999/").message
