"""CORS: headers only for the origins in ``server.cors_origins``, on every response."""

from __future__ import annotations

import json

import attrs
import httpx
import trio

from vllm_mlx_trio.config import API_KEYS_ENV
from vllm_mlx_trio.http.auth import ApiKeys
from vllm_mlx_trio.http.cors import DEFAULT_ALLOW_HEADERS, CorsPolicy, allowed_headers
from vllm_mlx_trio.http.loading_app import create_loading_app
from vllm_mlx_trio.testing.harness import fake_server

MODEL = "demo:tiny"
CHAT_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
APP = "https://app.example.com"
OTHER = "https://evil.example.net"
KEY = "sk-cors-test-key"


def with_origins(cfg, *origins: str):
    """``cfg`` allowing cross-origin requests from ``origins``."""
    return attrs.evolve(cfg, server=attrs.evolve(cfg.server, cors_origins=origins))


def cors_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.startswith("access-control-")}


def preflight(origin: str, method: str = "POST", headers: str = "authorization, content-type") -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers}


def assert_allowed(resp: httpx.Response, origin: str = APP) -> None:
    assert resp.headers["access-control-allow-origin"] == origin, resp.headers
    assert "X-Request-Id" in resp.headers["access-control-expose-headers"]
    assert "origin" in resp.headers["vary"].lower()


async def test_no_origins_means_no_cors_headers(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            get = await http.get("/v1/models", headers={"Origin": APP})
            post = await http.post("/v1/chat/completions", json=CHAT_BODY, headers={"Origin": APP})
            bad = await http.post("/v1/chat/completions", json={"model": MODEL}, headers={"Origin": APP})
            options = await http.options("/v1/chat/completions", headers=preflight(APP))
    assert (get.status_code, post.status_code, bad.status_code) == (200, 200, 400)
    assert options.status_code != 204  # not answered as a preflight
    for resp in (get, post, bad, options):
        assert cors_headers(resp) == {} and "vary" not in resp.headers


async def test_a_listed_origin_gets_headers_on_every_response(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    with trio.fail_after(20):
        async with fake_server(with_origins(fake_cfg, APP, "https://other.example.com:8443")) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as http:
                get = await http.get("/v1/models", headers=auth)
                post = await http.post("/v1/chat/completions", json=CHAT_BODY, headers=auth)
                unauthorized = await http.get("/v1/models", headers={"Origin": APP})
                bad = await http.post("/v1/chat/completions", json={"model": MODEL}, headers=auth)
                missing = await http.get("/v2/nothing", headers=auth)
                health = await http.get("/health", headers={"Origin": APP})
                stream_body = {**CHAT_BODY, "stream": True}
                async with http.stream("POST", "/v1/chat/completions", json=stream_body, headers=auth) as resp:
                    raw = (await resp.aread()).decode()
                    streamed = resp
    assert (get.status_code, post.status_code, bad.status_code, missing.status_code) == (200, 200, 400, 404)
    assert unauthorized.status_code == 401 and health.status_code == 200
    for resp in (get, post, unauthorized, bad, missing, health, streamed):
        assert_allowed(resp)
    assert streamed.status_code == 200 and raw.rstrip().endswith("data: [DONE]")
    assert json.loads(raw.split("\n\n")[0][len("data: ") :])["object"] == "chat.completion.chunk"


async def test_preflight_is_answered_without_a_key(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    with trio.fail_after(20):
        async with fake_server(with_origins(fake_cfg, APP)) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            answered = await http.options("/v1/chat/completions", headers=preflight(APP))
            garbage = await http.options("/v1/models", headers=preflight(APP, "GET", "x-ok, bad header\x7f"))
            unlisted = await http.options("/v1/chat/completions", headers=preflight(OTHER))
            plain_options = await http.options("/v1/models", headers={"Origin": APP})
    assert answered.status_code == 204 and answered.content == b""
    assert_allowed(answered)
    assert answered.headers["access-control-allow-methods"] == "GET, POST, DELETE, OPTIONS"
    assert answered.headers["access-control-allow-headers"] == "authorization, content-type"
    assert int(answered.headers["access-control-max-age"]) > 0
    assert answered.headers["x-request-id"]
    assert garbage.status_code == 204 and garbage.headers["access-control-allow-headers"] == DEFAULT_ALLOW_HEADERS
    assert unlisted.status_code == 204 and cors_headers(unlisted) == {}
    assert plain_options.status_code == 401  # an OPTIONS that is no preflight needs the key


async def test_an_unlisted_origin_gets_no_cors_headers(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(with_origins(fake_cfg, APP)) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            other = await http.get("/v1/models", headers={"Origin": OTHER})
            post = await http.post("/v1/chat/completions", json=CHAT_BODY, headers={"Origin": OTHER})
            none = await http.get("/v1/models")
    for resp in (other, post, none):
        assert resp.status_code == 200 and cors_headers(resp) == {}
        assert resp.headers["vary"] == "Origin"  # a cache must not reuse it for another origin


async def test_any_origin_with_a_star(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(with_origins(fake_cfg, "*")) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            get = await http.get("/v1/models", headers={"Origin": OTHER})
            answered = await http.options("/v1/models", headers=preflight(OTHER, "GET"))
            no_origin = await http.get("/v1/models")
    assert get.headers["access-control-allow-origin"] == "*"
    assert answered.status_code == 204 and answered.headers["access-control-allow-origin"] == "*"
    assert cors_headers(no_origin) == {}


def test_policy_origin_matching_and_requested_headers():
    policy = CorsPolicy(["https://App.Example.com", "http://localhost:3000"])
    assert policy.allows("https://app.example.com") and policy.allows("http://localhost:3000")
    assert not policy.allows("http://localhost:3001") and not policy.allows("null") and not policy.allows(None)
    allowed = policy.response_headers("https://app.example.com")
    assert allowed["Access-Control-Allow-Origin"] == "https://app.example.com"
    assert not CorsPolicy().enabled and CorsPolicy().response_headers(APP) == {}
    assert allowed_headers("Authorization,  X-Stainless-Lang ") == "Authorization, X-Stainless-Lang"
    assert allowed_headers(None) == allowed_headers("") == allowed_headers("a b") == DEFAULT_ALLOW_HEADERS
    assert allowed_headers(",".join(["x"] * 1000)) == DEFAULT_ALLOW_HEADERS


async def call_asgi(app, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """One request to a bare ASGI app: (status, headers, body)."""
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    await app({"type": "http", "method": method, "path": path, "headers": raw}, receive, send)
    start, body = sent
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body["body"]


async def test_the_loading_app_follows_the_same_rules():
    app = create_loading_app(ApiKeys([KEY]), CorsPolicy([APP]))
    with trio.fail_after(5):
        health = await call_asgi(app, "GET", "/health", {"Origin": APP})
        refused = await call_asgi(app, "POST", "/v1/chat/completions", {"Origin": APP, "Content-Length": "2"})
        loading = await call_asgi(app, "GET", "/v1/models", {"Origin": OTHER, "Authorization": f"Bearer {KEY}"})
        answered = await call_asgi(app, "OPTIONS", "/v1/models", preflight(APP))
    assert health[0] == 503 and json.loads(health[2]) == {"status": "loading"}
    assert health[1]["access-control-allow-origin"] == APP and health[1]["vary"] == "Origin"
    assert refused[0] == 401 and json.loads(refused[2])["error"]["type"] == "authentication_error"
    assert refused[1]["www-authenticate"] == "Bearer" and refused[1]["connection"] == "close"
    assert refused[1]["access-control-allow-origin"] == APP
    assert loading[0] == 503 and json.loads(loading[2])["error"]["code"] == "model_loading"
    assert not any(k.startswith("access-control-") for k in loading[1])
    assert answered[0] == 204 and answered[2] == b"" and answered[1]["access-control-max-age"]
    bare = create_loading_app(ApiKeys(), CorsPolicy())
    with trio.fail_after(5):
        plain = await call_asgi(bare, "GET", "/v1/models", {"Origin": APP})
    assert plain[0] == 503 and not any(k.startswith("access-control-") or k == "vary" for k in plain[1])
