"""HTTPS fetches: the connection goes to the checked address, while TLS is verified against
the URL's host name (SNI and certificate), with the system's trust store by default."""

from __future__ import annotations

import datetime
import ssl
import threading
from http.server import ThreadingHTTPServer

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fetch_helpers import PUBLIC_IP, Handler, Network
from media_helpers import image, prompt

from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.media import fetch


def self_signed(tmp_path, host: str) -> tuple[str, str]:
    """(cert file, key file) of a self-signed certificate for ``host``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / f"{host}.crt", tmp_path / f"{host}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_file), str(key_file)


@pytest.fixture
def tls_server(tmp_path):
    """An HTTPS server on 127.0.0.1 whose certificate names public.example."""
    cert, key = self_signed(tmp_path, "public.example")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, cert
    httpd.shutdown()
    httpd.server_close()


def trusting(monkeypatch, cafile: str) -> None:
    """The fetcher's default context, trusting ``cafile`` as well."""
    real = ssl.create_default_context

    def with_ca():
        context = real()
        context.load_verify_locations(cafile)
        return context

    monkeypatch.setattr(fetch.ssl, "create_default_context", with_ca)


def test_an_untrusted_certificate_is_refused(tls_server):
    httpd, _ = tls_server
    net = Network(httpd, {"public.example": [PUBLIC_IP]})
    with pytest.raises(InvalidRequestError, match="SSLCertVerificationError"):
        net.loader().load_prompt_media(prompt(image(f"https://public.example:{httpd.server_address[1]}/img")))
    assert net.connected == [PUBLIC_IP]


def test_tls_is_verified_against_the_host_name_not_the_address(tls_server, monkeypatch):
    httpd, cert = tls_server
    trusting(monkeypatch, cert)
    net = Network(httpd, {"public.example": [PUBLIC_IP]})
    url = f"https://public.example:{httpd.server_address[1]}/img"
    (loaded,) = net.loader().load_prompt_media(prompt(image(url)))
    assert loaded.image.size == (5, 4) and net.connected == [PUBLIC_IP]


def test_a_certificate_for_another_host_is_refused(tls_server, monkeypatch):
    httpd, cert = tls_server
    trusting(monkeypatch, cert)
    net = Network(httpd, {"other.example": [PUBLIC_IP]})
    with pytest.raises(InvalidRequestError, match="SSLCertVerificationError"):
        net.loader().load_prompt_media(prompt(image(f"https://other.example:{httpd.server_address[1]}/img")))
