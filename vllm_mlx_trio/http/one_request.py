"""One engine request behind an HTTP route whose protocol is not chat completions.

The Anthropic Messages and OpenAI Responses routes run one engine request per HTTP request
and translate its deltas into their own events. What they share with the chat route lives
here, built from the chat route's own pieces: engine ids (:class:`EngineIds`), the request's
log line (:class:`RequestRecord`), and an SSE body (:class:`EventStreamBody`) that closes the
stream on a client disconnect, which aborts the request before the scheduler's next step.

The protocol itself is an :class:`EventSource`: the events that open the stream, those of
one delta, those that close it, a failure's event, and a keep-alive ``ping`` sent whenever
nothing else was sent for ``ping_interval_s`` (a long prefill must not look like a dead
connection to a client or a proxy).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Protocol

import attrs
import quart
import trio
from quart.wrappers.response import ResponseBody

from ..core.params import SamplingParams
from ..engine import Engine
from ..errors import VllmMlxTrioError
from ..messages import ChatMessage
from ..stream import Delta, RequestStream
from .openai.routes import SSE_HEADERS
from .request_log import REQUEST_ID_HEADER, EngineIds, RequestRecord, error_code, request_id_from
from .request_streams import owned_by_request

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Outcome:
    """A non-streamed request's result: its text, why it ended, and the stop string hit."""

    text: str
    finish_reason: str | None
    stop_sequence: str | None


class EventSource(Protocol):
    """A protocol's SSE events for one request (each method returns SSE text, maybe empty)."""

    def opening(self, stream: RequestStream) -> str: ...

    def on_delta(self, delta: Delta) -> str: ...

    def closing(self, stream: RequestStream) -> str: ...

    def on_error(self, exc: VllmMlxTrioError) -> str: ...

    def ping(self) -> str: ...


class OneRequestRunner:
    """Submits and reads one engine request per HTTP request, logging it like the chat route."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._engine_ids = EngineIds(engine)

    @contextlib.contextmanager
    def record(self) -> Iterator[tuple[RequestRecord, list[str]]]:
        """The request's record (logged once) and the list its engine id goes into."""
        ids: list[str] = []
        request_id = quart.g.get("request_id") or request_id_from(quart.request.headers.get(REQUEST_ID_HEADER))
        record = RequestRecord(
            request_id, quart.request.path, self.engine.metrics, on_finish=lambda: self._engine_ids.release(ids)
        )
        with record.outcome():
            yield record, ids

    async def submit(
        self, record: RequestRecord, ids: list[str], prompt: tuple[ChatMessage, ...], params: SamplingParams
    ) -> RequestStream:
        ids.extend(self._engine_ids.reserve(record.request_id, 1))
        record.submitting()
        stream = owned_by_request(await self.engine.submit(prompt, params, request_id=ids[0], endpoint=record.endpoint))
        record.streams = [stream]
        return stream

    async def collect(self, stream: RequestStream, record: RequestRecord) -> Outcome:
        """Read the stream to its end (closing it), and finish the record."""
        texts: list[str] = []
        with stream:
            async for delta in stream:
                record.delta()
                texts.append(delta.text)
        record.finish("ok")
        return Outcome(text="".join(texts), finish_reason=stream.finish_reason, stop_sequence=stream.stop_sequence)

    def streaming_response(
        self, stream: RequestStream, source: EventSource, record: RequestRecord, *, ping_interval_s: float
    ) -> quart.Response:
        body = EventStreamBody(stream, source, record, ping_interval_s=ping_interval_s)
        response = quart.Response(body, mimetype="text/event-stream", headers=SSE_HEADERS)
        response.timeout = None  # Quart's 60 s response timeout must not cut long streams
        return response


class EventStreamBody(ResponseBody):
    """The SSE body of one request in an :class:`EventSource`'s protocol.

    Quart writes it as ``async with body: async for event in body`` in one task, so a client
    disconnect cancels the loop; ``__aexit__`` then closes the stream (aborting the request)
    and logs the request's line (``aborted`` on a disconnect).
    """

    def __init__(self, stream: RequestStream, source: EventSource, record: RequestRecord, *, ping_interval_s: float):
        self._stream = stream
        self._source = source
        self._record = record
        self._ping_interval_s = ping_interval_s
        self._events: AsyncIterator[str] | None = None
        self._error: str | None = None
        self._complete = False

    async def __aenter__(self) -> EventStreamBody:
        self._events = self._sse_events()
        return self

    def __aiter__(self) -> AsyncIterator[str]:
        assert self._events is not None, "iterate the body inside `async with`"
        return self._events

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._events is not None:
                await self._events.aclose()
        finally:
            self._stream.close()
            self._log_outcome(exc)

    def _log_outcome(self, exc: BaseException | None) -> None:
        self._record.stream_ended(exc, error=self._error, complete=self._complete)

    async def _sse_events(self) -> AsyncIterator[str]:
        source, stream = self._source, self._stream
        yield source.opening(stream)
        while True:
            try:
                delta = await self._next_delta()
            except VllmMlxTrioError as exc:
                logger.warning("request %s failed mid-stream: %s", stream.request_id, exc)
                self._error = error_code(exc)
                yield source.on_error(exc)
                return
            if delta is None:
                yield source.ping()
                continue
            if delta is StopAsyncIteration:
                break
            self._record.delta()
            if events := source.on_delta(delta):
                yield events
        self._complete = True
        yield source.closing(stream)

    async def _next_delta(self):
        """The next delta; None when none came within the ping interval (a receive cancelled
        before it takes an output loses nothing); ``StopAsyncIteration`` at the end."""
        with trio.move_on_after(self._ping_interval_s):
            try:
                return await self._stream.__anext__()
            except StopAsyncIteration:
                return StopAsyncIteration
        return None
