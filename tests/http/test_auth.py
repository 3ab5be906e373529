"""API keys: every route but /health needs ``Authorization: Bearer``; keys never logged."""

from __future__ import annotations

import json
import logging

import attrs
import httpx
import openai
import pytest
import trio

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.config import API_KEYS_ENV
from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.http.auth import ApiKeys, load_api_keys
from vllm_mlx_trio.serve import serve
from vllm_mlx_trio.testing.fake_executor import text_script
from vllm_mlx_trio.testing.harness import fake_executor_factory, fake_server, free_port, slow_loading_factory

MODEL = "demo:tiny"
CHAT = [{"role": "user", "content": "hi"}]
KEY = "sk-test-right-key-0123456789"
OTHER_KEY = "sk-test-second-key-abcdef"
WRONG_KEY = "sk-test-WRONG-key-9876543210"
CHAT_BODY = {"model": MODEL, "messages": CHAT, "max_tokens": 5}


def with_key_file(cfg, path):
    return attrs.evolve(cfg, server=attrs.evolve(cfg.server, api_key_file=str(path)))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_401(resp: httpx.Response, *, request_id: bool = True) -> dict:
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    assert not request_id or resp.headers["x-request-id"]
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("authentication_error", None, "invalid_api_key")
    assert KEY not in resp.text and WRONG_KEY not in resp.text
    return error


async def test_no_keys_means_no_auth(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            models = await http.get(f"{srv.url}/v1/models")
            chat = await http.post(f"{srv.url}/v1/chat/completions", json=CHAT_BODY)
            status = await http.get(f"{srv.url}/v1/status", headers=bearer(WRONG_KEY))
    assert (models.status_code, chat.status_code, status.status_code) == (200, 200, 200)
    assert "www-authenticate" not in models.headers


async def test_env_keys_guard_every_route_but_health(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient() as http:
            missing = await http.get(f"{srv.url}/v1/models", headers={"X-Request-Id": "abc"})
            wrong = await http.get(f"{srv.url}/v1/models", headers=bearer(WRONG_KEY))
            basic = await http.get(f"{srv.url}/v1/models", headers={"Authorization": f"Basic {KEY}"})
            right = await http.get(f"{srv.url}/v1/models", headers=bearer(KEY))
            lower = await http.get(f"{srv.url}/v1/models", headers={"Authorization": f"bearer  {KEY}"})
            health = await http.get(f"{srv.url}/health")
            guarded = {
                path: [(await http.get(f"{srv.url}{path}", headers=h)).status_code for h in ({}, bearer(KEY))]
                for path in ("/metrics", "/v1/status", "/v1/cache/stats", "/version", "/v2/nothing")
            }
            delete = await http.delete(f"{srv.url}/v1/cache")
    assert assert_401(missing)["message"].startswith("Missing API key")
    assert missing.headers["x-request-id"] == "abc"
    assert assert_401(wrong)["message"] == "Incorrect API key provided."
    assert assert_401(basic)["message"].startswith("Missing API key")
    assert right.status_code == 200 and right.json()["data"][0]["id"] == MODEL
    assert lower.status_code == 200
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert guarded == {
        "/metrics": [401, 200],
        "/v1/status": [401, 200],
        "/v1/cache/stats": [401, 200],
        "/version": [401, 200],
        "/v2/nothing": [401, 404],
    }
    assert delete.status_code == 401


async def test_completions_with_a_key_streaming_and_not(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    url = "/v1/chat/completions"
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            refused = await http.post(url, json=CHAT_BODY, headers=bearer(WRONG_KEY))
            # the refused request's body did not spoil the connection for the next one
            plain = await http.post(url, json=CHAT_BODY, headers=bearer(KEY))
            stream_refused = await http.post(url, json={**CHAT_BODY, "stream": True})
            async with http.stream("POST", url, json={**CHAT_BODY, "stream": True}, headers=bearer(KEY)) as resp:
                raw = (await resp.aread()).decode()
                streamed_status = resp.status_code
    assert_401(refused)
    assert_401(stream_refused)
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == "Hello"
    events = [e for e in raw.split("\n\n") if e]
    assert streamed_status == 200 and events[-1] == "data: [DONE]"
    text = "".join(json.loads(e[len("data: ") :])["choices"][0]["delta"].get("content") or "" for e in events[:-1])
    assert text == "Hello"


async def test_file_keys_with_comments_and_env_keys_all_work(fake_cfg, monkeypatch, tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text(f"# production keys\n\n  {KEY}  \n# {WRONG_KEY} retired\n{OTHER_KEY}\n")
    monkeypatch.setenv(API_KEYS_ENV, " sk-from-env , ")
    with trio.fail_after(20):
        async with fake_server(with_key_file(fake_cfg, key_file)) as srv, httpx.AsyncClient() as http:
            statuses = {
                key: (await http.get(f"{srv.url}/v1/models", headers=bearer(key))).status_code
                for key in (KEY, OTHER_KEY, "sk-from-env", WRONG_KEY, "#", "production")
            }
    assert statuses == {KEY: 200, OTHER_KEY: 200, "sk-from-env": 200, WRONG_KEY: 401, "#": 401, "production": 401}


async def test_openai_client_with_right_and_wrong_key(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, f"{KEY},{OTHER_KEY}")
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv:
            async with openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=OTHER_KEY, max_retries=0) as c:
                reply = await c.chat.completions.create(model=MODEL, messages=CHAT)
                stream = await c.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
                streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream])
            async with openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key=WRONG_KEY, max_retries=0) as c:
                with pytest.raises(openai.AuthenticationError) as refused:
                    await c.chat.completions.create(model=MODEL, messages=CHAT)
    assert reply.choices[0].message.content == "Hello, world!" and streamed == "Hello, world!"
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"
    assert WRONG_KEY not in str(refused.value)


async def test_keys_never_reach_the_logs(fake_cfg, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    body = {**CHAT_BODY, "stream": True}
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            await http.post("/v1/chat/completions", json=body, headers=bearer(WRONG_KEY))
            await http.get("/v1/models", headers={"Authorization": WRONG_KEY})
            await http.post("/v1/chat/completions", json=body, headers=bearer(KEY))
            await http.post("/v1/chat/completions", json={"model": "nope"}, headers=bearer(KEY))
            await http.get("/v1/status", headers=bearer(KEY))
    refusals = [r for r in caplog.records if r.getMessage().startswith("unauthorized request")]
    assert len(refusals) == 2 and all("reason=" in r.getMessage() for r in refusals)
    assert any(r.getMessage().startswith("request finished") for r in caplog.records)
    for record in caplog.records:
        text = f"{record.getMessage()} {record.args!r} {vars(record)!r}"
        assert KEY not in text and WRONG_KEY not in text, record
    assert KEY not in caplog.text and WRONG_KEY not in caplog.text


def test_key_set_never_shows_its_keys():
    keys = ApiKeys([KEY, OTHER_KEY])
    assert repr(keys) == "ApiKeys(2 keys)" and KEY not in str(keys)
    assert keys.matches(KEY.encode()) and keys.matches(OTHER_KEY.encode())
    assert not keys.matches(KEY.encode()[:-1]) and not keys.matches(b"")
    assert not ApiKeys().enabled and ApiKeys().refusal(None) is None


def test_config_show_never_shows_env_keys(capsys, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    assert main(["config", "show", "--set", "server.api_key_file=/etc/keys"]) == 0
    out = capsys.readouterr().out
    assert KEY not in out and 'api_key_file = "/etc/keys"' in out


BAD_KEY_FILES = [
    # (what, file content or None for a missing file, expected words in the message)
    ("missing", None, "cannot read it"),
    ("empty", "", "holds no API key"),
    ("only comments", "# one\n\n   \n# two\n", "holds no API key"),
    ("key with a space", f"{KEY} {WRONG_KEY}\n", "line 1 is not one key"),
    ("not UTF-8", b"\xff\xfe" + KEY.encode(), "not UTF-8"),
]


@pytest.mark.parametrize(("what", "content", "words"), BAD_KEY_FILES, ids=[c[0] for c in BAD_KEY_FILES])
def test_a_bad_key_file_is_a_config_error_naming_the_file(fake_cfg, tmp_path, what, content, words):
    path = tmp_path / "api-keys"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        load_api_keys(with_key_file(fake_cfg, path).server, environ={})
    message = str(caught.value)
    assert message.startswith("server.api_key_file: ") and str(path) in message and words in message
    assert "\n" not in message and KEY not in message and WRONG_KEY not in message


def test_a_bad_env_key_is_a_config_error(fake_cfg):
    with pytest.raises(ConfigError, match=f"^{API_KEYS_ENV}: key 2 is not printable ASCII"):
        load_api_keys(fake_cfg.server, environ={API_KEYS_ENV: f"{KEY}, caf\u00e9 "})


async def test_serve_fails_before_binding_with_a_bad_key_file(fake_cfg, tmp_path):
    cfg = with_key_file(fake_cfg, tmp_path / "absent")
    with trio.fail_after(20):
        with pytest.raises(ConfigError, match="server.api_key_file"):
            await serve(cfg, executor_factory=fake_executor_factory(script=text_script("x")))


def test_cli_serve_exits_1_with_a_one_line_cause(tmp_path, capsys):
    missing = tmp_path / "no-keys-here"
    assert main(["serve", "--set", f"server.api_key_file={missing}", "--set", "server.port=0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-mlx-trio: server.api_key_file: ") and str(missing) in err[0]


async def test_while_loading_health_is_open_and_the_api_needs_a_key(fake_cfg, monkeypatch):
    monkeypatch.setenv(API_KEYS_ENV, KEY)
    port = free_port()
    cfg = attrs.evolve(fake_cfg, server=attrs.evolve(fake_cfg.server, port=port))
    loading, loaded, stop = trio.Event(), trio.Event(), trio.Event()
    factory = slow_loading_factory(loading, loaded)
    url = f"http://127.0.0.1:{port}"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve(cfg, shutdown_trigger=stop.wait, executor_factory=factory))
            async with httpx.AsyncClient(base_url=url, timeout=5) as client:
                await loading.wait()  # the model load has begun: the loading app listens
                health = await client.get("/health")
                refused = await client.get("/v1/models", headers=bearer(WRONG_KEY))
                loading = await client.get("/v1/models", headers=bearer(KEY))
            loaded.set()
            stop.set()
    assert (health.status_code, health.json()) == (503, {"status": "loading"})
    assert_401(refused, request_id=False)  # the loading app sets no request ids
    assert loading.status_code == 503 and loading.json()["error"]["code"] == "model_loading"
