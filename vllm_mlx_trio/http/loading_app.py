"""The app that answers while the model loads: ``/health`` is 503 "loading", every other
path a 503 OpenAI error with ``Retry-After`` (in Anthropic's shape on ``/v1/messages``).
A bare ASGI callable: nothing to set up.

It keeps the real app's rules: with API keys, a path other than ``/health`` without a valid
key is a 401 (the 503 tells a caller without a key nothing), and with CORS origins a
preflight is answered and an allowed origin gets its headers.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from .anthropic.errors import is_messages_path, reshaped
from .auth import API_KEY_HEADER, OPEN_PATHS, ApiKeys, log_refusal, unauthorized_body, unauthorized_headers
from .cors import CorsPolicy
from .errors import RETRY_AFTER_S, error_body

_LOADING_MESSAGE = "The model is loading; retry shortly."

AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def create_loading_app(api_keys: ApiKeys, cors: CorsPolicy) -> AsgiApp:
    """The loading app for these keys and CORS origins."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        status, body, headers = _answer(scope, api_keys, cors)
        if is_messages_path(scope["path"]):
            body = reshaped(status, body)  # Anthropic's clients parse their own shape
        payload = b"" if body is None else json.dumps(body).encode()
        raw_headers = [(b"content-length", str(len(payload)).encode())]
        if body is not None:
            raw_headers.append((b"content-type", b"application/json"))
        raw_headers += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
        await send({"type": "http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "http.response.body", "body": payload})

    return app


Answer = tuple[int, dict | None, dict[str, str]]


def _answer(scope: dict[str, Any], api_keys: ApiKeys, cors: CorsPolicy) -> Answer:
    """(status, JSON body or None, headers) for one request."""
    request_headers = _headers(scope)
    origin = request_headers.get("origin")
    headers = cors.response_headers(origin)
    if cors.varies:
        headers["Vary"] = "Origin"
    method = scope["method"]
    if cors.is_preflight(method, origin, request_headers.get("access-control-request-method")):
        headers.update(cors.preflight_headers(origin, request_headers.get("access-control-request-headers")))
        return 204, None, headers
    if scope["path"] in OPEN_PATHS:
        return 503, {"status": "loading"}, {**headers, "Retry-After": str(RETRY_AFTER_S)}
    authorization, api_key = request_headers.get("authorization"), request_headers.get(API_KEY_HEADER)
    refusal = api_keys.refusal(
        None if authorization is None else authorization.encode("latin-1"),
        None if api_key is None else api_key.encode("latin-1"),
    )
    if refusal is not None:
        log_refusal(method, scope["path"], refusal)
        length, encoding = request_headers.get("content-length"), request_headers.get("transfer-encoding")
        refused = unauthorized_headers(length, encoding)
        return 401, unauthorized_body(refusal), {**headers, **refused}
    body = error_body(_LOADING_MESSAGE, type="service_unavailable", code="model_loading")
    return 503, body, {**headers, "Retry-After": str(RETRY_AFTER_S)}


def _headers(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name (the first of repeated ones), as Latin-1 text."""
    headers: dict[str, str] = {}
    for name, value in scope.get("headers", ()):
        headers.setdefault(bytes(name).decode("latin-1").lower(), bytes(value).decode("latin-1"))
    return headers


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
