"""The connection closes after a response that says ``Connection: close``.

Hypercorn closes the socket from inside the ASGI ``send`` that carries a response's last body
message: the stream's end wakes Quart-Trio's receive task with ``http.disconnect``, and that
task cancels the request's nursery, the one whose task is still inside that ``send``. The
cancellation lands on the socket's ``send_eof`` checkpoint, so the close never happens and the
connection stays open until the client gives up (seen with Hypercorn 0.18 and Quart-Trio 0.12;
a plain ASGI app on Hypercorn closes it). A client that sent ``Connection: close`` and reads to
the end would wait, and so would one refused with 413, whose unread body is still on the wire.

The last body message is therefore sent shielded. That adds no wait Hypercorn does not have:
it already shields its socket writes, and the close is a shutdown and a close.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

AsgiApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def close_after_last_body(asgi_app: AsgiApp) -> AsgiApp:
    """``asgi_app`` with each HTTP response's last body message sent shielded from cancellation."""

    async def app(scope: dict, receive: Callable[[], Awaitable[dict]], send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await asgi_app(scope, receive, send)
            return

        async def send_last_shielded(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                with trio.CancelScope(shield=True):
                    await send(message)
            else:
                await send(message)

        await asgi_app(scope, receive, send_last_shielded)

    return app
