"""The ASGI router in front of several models: a request goes to the app of the model it names.

A POST to a model route (chat, completions, messages, responses, embeddings, tokenize) is read
whole (``limits.max_body_bytes``, ``limits.body_timeout_s``), its ``model`` looked up in the
registry, and it is handed, body replayed, to that model's own app (http/app.py over its own
engine) under a lease; a model that is not loaded is loaded first while the request waits (a
client that leaves during the wait is dropped from it). Other routes take a loaded model's app
with ``?model=NAME`` (``/metrics``, ``/v1/cache``, stored responses); everything else (the
model list, unload, status, health) is the front app's (http/models_routes.py), which also
answers the 401 of a request without a valid key before any model is touched.
"""

from __future__ import annotations

import functools
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from ..config import EngineConfig
from ..errors import VllmMlxTrioError
from ..models.registry import Lease, ModelRegistry, ModelSlot, ModelState
from .anthropic.errors import is_messages_path, reshaped
from .auth import API_KEY_HEADER, ApiKeys
from .cors import CorsPolicy
from .errors import describe, error_body
from .request_log import REQUEST_ID_HEADER, request_id_from

logger = logging.getLogger(__name__)

AsgiApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

#: The routes whose JSON body names the model that answers.
MODEL_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/embeddings",
        "/tokenize",
        "/detokenize",
    }
)


class _BodyTooLarge(Exception):
    pass


def create_router_app(registry: ModelRegistry, front: AsgiApp, cfg: EngineConfig, api_keys: ApiKeys) -> AsgiApp:
    """The server's app: model routes to the models' apps, the rest to ``front``."""
    max_body, body_timeout = cfg.limits.max_body_bytes, cfg.limits.body_timeout_s
    cors = CorsPolicy(cfg.server.cors_origins)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not _authorized(scope, api_keys):
            await front(scope, receive, send)  # lifespan, and every 401 in its usual shape
            return
        if scope["method"] == "POST" and scope["path"] in MODEL_ROUTES:
            await _model_route(scope, receive, send)
            return
        slot = _queried_slot(registry, scope)
        if slot is None:
            await front(scope, receive, send)
            return
        lease = await registry.acquire(slot)
        try:
            await lease.serving(scope, receive, send)
        finally:
            lease.release()

    async def _model_route(scope: dict[str, Any], receive: Any, send: Any) -> None:
        reply_error = functools.partial(_send_error, scope, send, cors)
        try:
            with trio.fail_after(body_timeout):
                body = await _read_body(receive, max_body)
        except trio.TooSlowError:
            message = "The request body was not received in time."
            await reply_error(408, error_body(message, type="invalid_request_error", code="request_timeout"))
            return
        except _BodyTooLarge:
            message = f"The request body exceeds {max_body} bytes."
            body = error_body(message, type="request_too_large", code="request_entity_too_large")
            await reply_error(413, body, {"Connection": "close"})  # the rest of it is still on the wire
            return
        try:
            slot = registry.slot_for(_model_named(body))
            lease = await _acquire_unless_gone(registry, slot, receive)
        except VllmMlxTrioError as exc:
            await reply_error(*describe(exc))
            return
        if lease is None:
            return  # the client left while its model loaded
        try:
            await lease.serving(scope, _replaying(body, receive), send)
        finally:
            lease.release()

    return app


def _authorized(scope: dict[str, Any], api_keys: ApiKeys) -> bool:
    headers = dict(scope.get("headers", ()))
    return api_keys.refusal(headers.get(b"authorization"), headers.get(API_KEY_HEADER.encode())) is None


def _queried_slot(registry: ModelRegistry, scope: dict[str, Any]) -> ModelSlot | None:
    """The loaded model ``?model=NAME`` names, for the routes that are not the front's."""
    query = urllib.parse.parse_qs(scope.get("query_string", b"").decode("latin-1"))
    names = query.get("model")
    if not names or scope["path"].startswith("/v1/models") or scope["path"] in ("/health", "/v1/status"):
        return None
    try:
        slot = registry.slot_for(names[0])
    except VllmMlxTrioError:
        return None
    return slot if slot.state is ModelState.LOADED else None


async def _read_body(receive: Any, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client left: the app sees it in its turn
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _model_named(body: bytes) -> str | None:
    """The body's ``model`` when it is a JSON object naming one; else None (the model app
    that gets it answers the bad body in its route's own words)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    model = parsed.get("model") if isinstance(parsed, dict) else None
    return model if isinstance(model, str) else None


async def _acquire_unless_gone(registry: ModelRegistry, slot: ModelSlot, receive: Any) -> Lease | None:
    """A lease on ``slot``; None when the client disconnects while its model loads."""
    if slot.state is ModelState.LOADED:
        return await registry.acquire(slot)
    lease: Lease | None = None
    refused: list[VllmMlxTrioError] = []
    async with trio.open_nursery() as nursery:

        async def watch_disconnect() -> None:
            message = await receive()
            if message["type"] == "http.disconnect":
                logger.info("client left while model %s loaded", slot.name)
                nursery.cancel_scope.cancel()

        async def take() -> None:
            nonlocal lease
            try:
                lease = await registry.acquire(slot)
            except VllmMlxTrioError as exc:
                refused.append(exc)
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch_disconnect)
        nursery.start_soon(take)
    if refused:
        raise refused[0]
    return lease


def _replaying(body: bytes, receive: Any) -> Any:
    """``receive`` with the body already read handed out first, as one message."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(
    scope: dict[str, Any], send: Any, cors: CorsPolicy, status: int, body: dict, headers: dict[str, str] | None = None
) -> None:
    """One JSON error, in Anthropic's shape on the Messages routes, with the CORS headers the
    request's origin gets."""
    if is_messages_path(scope["path"]):
        body = reshaped(status, body)
    origin = dict(scope.get("headers", ())).get(b"origin")
    headers = {**cors.response_headers(None if origin is None else origin.decode("latin-1")), **(headers or {})}
    if cors.varies:
        headers["Vary"] = "Origin"
    payload = json.dumps(body).encode()
    request_header = dict(scope.get("headers", ())).get(REQUEST_ID_HEADER.lower().encode())
    request_id = request_id_from(None if request_header is None else request_header.decode("latin-1"))
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (REQUEST_ID_HEADER.lower().encode(), request_id.encode()),
        *((name.lower().encode(), value.encode()) for name, value in headers.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
