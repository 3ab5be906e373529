"""The official SDKs' clients pointed at a test server: a placeholder key, no retries (a
test sees the first answer, whatever it is); and a raw HTTP/1.1 exchange, for what the bytes on
the wire must be."""

from __future__ import annotations

import urllib.parse
from typing import Any

import anthropic
import openai
import trio


def openai_client(url: str, *, api_key: str = "unused", **kwargs: Any) -> openai.AsyncOpenAI:
    """An OpenAI client for the server at ``url`` (its ``/v1`` routes)."""
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, **kwargs)


def anthropic_client(url: str, *, api_key: str = "unused", **kwargs: Any) -> anthropic.AsyncAnthropic:
    """An Anthropic client for the server at ``url`` (it adds ``/v1/messages`` itself)."""
    return anthropic.AsyncAnthropic(base_url=url, api_key=api_key, max_retries=0, **kwargs)


async def exchange(url: str, request: bytes) -> bytes:
    """Send ``request`` and read until the server closes the connection."""
    parts = urllib.parse.urlsplit(url)
    stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    received = b""
    async with stream:
        await stream.send_all(request)
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received


def post(path: str, body: bytes) -> bytes:
    """A JSON POST of ``body`` to ``path`` that asks the server to close the connection after it."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body
