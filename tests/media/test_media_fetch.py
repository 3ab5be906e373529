"""URL fetching against a real HTTP server on 127.0.0.1: the SSRF rule (checked addresses,
no connection to a refused one, redirects re-checked, the checked address is the one
connected to), the size limit while streaming, and the total deadline."""

from __future__ import annotations

import threading
from http.server import ThreadingHTTPServer

import pytest
from fetch_helpers import DEAD_IP, HANG_S, PUBLIC_IP, Handler, Network
from media_helpers import image, loader, prompt

from vllm_mlx_trio.errors import InvalidRequestError

FIRST = "messages[1].content[1]"


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


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://2852039166/latest/meta-data/", "metadata"),  # 169.254.169.254 as one decimal number
        ("http://0xa9fea9fe/", "metadata"),
        ("http://0251.0376.0251.0376/", "metadata"),  # octal
        ("http://0x7f000001/", "loopback"),
        ("http://127.1/", "loopback"),
        ("http://localhost/", "loopback"),
    ],
)
def test_other_spellings_of_refused_addresses_are_judged_by_the_system_resolver(server, url, words):
    """Numeric forms the system resolver turns into addresses (no DNS query needed) are judged
    by the address they resolve to, before any connection."""
    connected: list[str] = []

    def connect(ip, port, timeout_s):
        connected.append(ip)
        raise AssertionError("no connection may be made")

    assert words in refused(loader(connector=connect).load_prompt_media, url).message
    assert connected == []
