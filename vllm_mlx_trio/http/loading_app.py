"""The app that answers while the model loads: ``/health`` is 503 "loading", every other
path a 503 OpenAI error with ``Retry-After``. A bare ASGI callable: nothing to set up."""

from __future__ import annotations

import json
from typing import Any

from .errors import RETRY_AFTER_S, error_body

_LOADING_MESSAGE = "The model is loading; retry shortly."


async def loading_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
        return
    if scope["type"] != "http":
        return
    if scope["path"] == "/health":
        body: dict[str, Any] = {"status": "loading"}
    else:
        body = error_body(_LOADING_MESSAGE, type="service_unavailable", code="model_loading")
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"retry-after", str(RETRY_AFTER_S).encode()),
    ]
    await send({"type": "http.response.start", "status": 503, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
