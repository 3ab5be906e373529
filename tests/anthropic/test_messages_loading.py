"""While the model loads, ``/v1/messages`` answers in Anthropic's error shape (other paths in OpenAI's)."""

from __future__ import annotations

import anthropic
import httpx
import httpx2
import pytest
import trio

from vllm_mlx_trio.http.auth import ApiKeys
from vllm_mlx_trio.http.cors import CorsPolicy
from vllm_mlx_trio.http.loading_app import create_loading_app

KEY = "sk-loading-test-key-0123456789"
USER = [{"role": "user", "content": "hi"}]


def asgi_client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://loading")


def sdk_client(app, api_key: str) -> anthropic.AsyncAnthropic:
    """The SDK over its own httpx (``httpx2``), calling the ASGI app in process."""
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app))
    return anthropic.AsyncAnthropic(base_url="http://loading", api_key=api_key, max_retries=0, http_client=http)


async def test_messages_while_loading_is_an_overloaded_error_the_sdk_parses():
    app = create_loading_app(ApiKeys(), CorsPolicy())
    with trio.fail_after(10):
        async with asgi_client(app) as http:
            sdk = sdk_client(app, "x")
            with pytest.raises(anthropic.APIStatusError) as caught:
                await sdk.messages.create(model="m", max_tokens=5, messages=USER)
            count = await http.post("/v1/messages/count_tokens", json={})
            chat = await http.post("/v1/chat/completions", json={})
    assert caught.value.status_code == 503
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": caught.value.body["error"]["message"]},
    }
    assert "loading" in caught.value.body["error"]["message"]
    assert count.status_code == 503 and count.json()["error"]["type"] == "overloaded_error"
    assert count.headers["retry-after"]
    assert chat.status_code == 503 and chat.json()["error"]["code"] == "model_loading"  # OpenAI's shape elsewhere


async def test_refused_key_while_loading_is_an_authentication_error():
    app = create_loading_app(ApiKeys([KEY]), CorsPolicy())
    with trio.fail_after(10):
        async with asgi_client(app) as http:
            sdk = sdk_client(app, "sk-wrong")
            with pytest.raises(anthropic.AuthenticationError) as caught:
                await sdk.messages.create(model="m", max_tokens=5, messages=USER)
            allowed = await http.post("/v1/messages", json={}, headers={"x-api-key": KEY})
    assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "authentication_error"
    assert allowed.status_code == 503 and allowed.json()["type"] == "error"
