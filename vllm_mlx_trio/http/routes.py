"""The OpenAI routes: chat and text completions (streaming and not) and the model list."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import quart
import trio

from ..engine import Engine
from ..errors import VllmMlxTrioError
from ..stream import RequestStream
from .body import read_json_body
from .errors import describe
from .requests import ParsedRequest, parse_chat, parse_completion
from .responses import SSE_DONE, ResponseBuilder, sse

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def register_routes(app: quart.Quart, engine: Engine) -> None:
    model_name = engine.cfg.model_name

    @app.post("/v1/chat/completions")
    async def chat_completions():
        parsed = parse_chat(await read_json_body(), model_name=model_name)
        return await _complete(engine, parsed, ResponseBuilder(chat=True, model=model_name))

    @app.post("/v1/completions")
    async def completions():
        parsed = parse_completion(await read_json_body(), model_name=model_name)
        return await _complete(engine, parsed, ResponseBuilder(chat=False, model=model_name))

    @app.get("/v1/models")
    async def models():
        card = {"id": model_name, "object": "model", "created": 0, "owned_by": "vllm-mlx-trio"}
        return {"object": "list", "data": [card]}


async def _complete(engine: Engine, parsed: ParsedRequest, builder: ResponseBuilder):
    stream = await engine.submit(parsed.prompt, parsed.params)
    if not parsed.stream:
        with stream:
            text = "".join([delta.text async for delta in stream])
        return builder.full(text, stream.finish_reason, stream.usage)
    response = quart.Response(
        _sse_events(stream, builder, parsed.include_usage),
        mimetype="text/event-stream",
        headers=SSE_HEADERS,
    )
    response.timeout = None  # Quart's 60 s response timeout must not cut long streams
    return response


async def _sse_events(
    stream: RequestStream, builder: ResponseBuilder, include_usage: bool
) -> AsyncIterator[str]:
    """The SSE body. A disconnect cancels it; ``with stream`` then aborts the request."""
    with stream:
        first = True
        try:
            if builder.chat:
                yield builder.chunk("", first=True)
                first = False
            async for delta in stream:
                if delta.text or delta.finish_reason is not None or first:
                    yield builder.chunk(delta.text, delta.finish_reason, first=first)
                    first = False
        except VllmMlxTrioError as exc:
            _status, body, _headers = describe(exc)
            logger.warning("request %s failed mid-stream: %s", stream.request_id, exc)
            yield sse(body)
            return
        except trio.Cancelled:
            logger.info("request %s: client disconnected", stream.request_id)
            raise
    if include_usage:
        yield builder.usage_chunk(stream.usage)
    yield SSE_DONE
