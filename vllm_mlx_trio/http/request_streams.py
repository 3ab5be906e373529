"""An HTTP request's engine streams are closed when its ASGI call ends, whatever happened.

A handler opens a request's streams and hands them to its response; a streaming body closes
them when it ends (Quart writes it as ``async with body``). But Quart enters the body only
after the response has started: a client that leaves between the handler's return and that
start cancels the call before the body is ever entered, and its streams would stay open, each
holding an engine slot while its request runs to the end. The ASGI call spans the request's
whole life, so the streams it opened are closed there at the latest (a second close is a
no-op), which aborts any request still running.
"""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable

from ..stream import RequestStream

AsgiApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

#: The streams the HTTP request being handled has opened (None outside one).
_REQUEST_STREAMS: contextvars.ContextVar[list[RequestStream] | None] = contextvars.ContextVar(
    "request_streams", default=None
)


def owned_by_request(stream: RequestStream) -> RequestStream:
    """``stream``, also in the care of the HTTP request being handled: closed when that ends."""
    streams = _REQUEST_STREAMS.get()
    if streams is not None:
        streams.append(stream)
    return stream


def close_streams_at_end(asgi_app: AsgiApp) -> AsgiApp:
    """``asgi_app`` with every stream an HTTP request opened (:func:`owned_by_request`) closed
    when the request's call returns or is cancelled. The list is shared with the tasks the
    call starts: they inherit this context."""

    async def app(scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return
        streams: list[RequestStream] = []
        token = _REQUEST_STREAMS.set(streams)
        try:
            await asgi_app(scope, receive, send)
        finally:
            _REQUEST_STREAMS.reset(token)
            for stream in streams:
                stream.close()

    return app
