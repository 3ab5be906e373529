"""Errors in Anthropic's shape on the Messages routes, with the statuses every route uses.

The app answers every failure in OpenAI's shape (:mod:`..errors`, the auth guard, Quart's own
4xx). On the Messages routes one ``after_request`` hook rewrites such a body into Anthropic's
``{"type": "error", "error": {"type", "message"}}``, so every error there, whoever raised it
(a bad body, a 401, a 413, a 429 while full, a 503 while draining, a 404 for an unknown path),
reaches the client in the route's own shape. In-stream failures are an ``error`` event.
"""

from __future__ import annotations

import json
from typing import Any

import quart

from ...errors import VllmMlxTrioError
from ..errors import describe

#: Anthropic's error type for each status this server answers with.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
FALLBACK_CLIENT_ERROR = "invalid_request_error"
FALLBACK_SERVER_ERROR = "api_error"


#: Where Anthropic's shape applies: this path and everything under it.
MESSAGES_PATH = "/v1/messages"


def is_messages_path(path: str) -> bool:
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def reshaped(status: int, body: Any) -> Any:
    """An OpenAI-shaped error body in Anthropic's shape (any other body as it is)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body.get("type") != "error":
        return anthropic_error(status, body["error"].get("message") or "Request failed.")
    return body


def error_type(status: int) -> str:
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return FALLBACK_SERVER_ERROR if status >= 500 else FALLBACK_CLIENT_ERROR


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(status), "message": message}}


def error_event(exc: VllmMlxTrioError) -> str:
    """A failure after the stream began: Anthropic's ``error`` event."""
    status, body, _headers = describe(exc)
    return sse_event("error", anthropic_error(status, body["error"]["message"]))


def sse_event(name: str, payload: dict[str, Any]) -> str:
    """One SSE event with its ``event:`` line (the SDK drops events without one)."""
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


def register_error_shape(app: quart.Quart) -> None:
    """Every JSON error answered on the Messages paths gets Anthropic's shape."""

    @app.after_request
    async def anthropic_error_shape(response: quart.Response) -> quart.Response:
        if response.status_code < 400 or not is_messages_path(quart.request.path):
            return response
        if response.mimetype != "application/json":
            return response
        body = await response.get_json()
        shaped = reshaped(response.status_code, body)
        if shaped is not body:
            response.set_data(json.dumps(shaped, ensure_ascii=False))
        return response
