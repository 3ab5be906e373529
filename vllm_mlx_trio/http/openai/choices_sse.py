"""The SSE body of a chat or completions request's ``n`` choices, merged into one event stream
(one choice read straight by the writer; several through a small buffer)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from types import TracebackType

import attrs
import trio
from quart.wrappers.response import ResponseBody

from ...errors import VllmMlxTrioError
from ...stream import Delta, RequestStream
from ..agent_output import ChoiceOutput, OutputSpec
from ..errors import describe
from ..request_log import RequestRecord, error_code
from .responses import SSE_DONE, ResponseBuilder, combined_usage, sse

logger = logging.getLogger(__name__)

#: Deltas waiting between the choices' readers and the socket writer. A few let every choice
#: keep reading while one chunk is written; beyond that the readers wait, their outboxes fill
#: and the scheduler coalesces their tokens, so a slow client never grows this buffer.
MERGE_BUFFER = 8
#: One choice's delta, or the error that ended it, by choice index.
ChoiceItem = tuple[int, Delta | VllmMlxTrioError]


class ChoicesSseBody(ResponseBody):
    """The SSE body of ``n`` choices, merged into one event stream.

    Quart writes a body as ``async with body: async for event in body``, in one task. The
    nursery that reads the choices is opened in ``__aenter__`` and closed in ``__aexit__``,
    around that loop, so it nests like any ``async with`` (no nursery is held across an
    async generator's ``yield``). A disconnect cancels the writer; ``__aexit__`` then
    cancels the readers and closes every stream, which aborts their requests. ``__aexit__``
    also logs the request's line through its ``record`` (``aborted`` on a disconnect).
    """

    def __init__(
        self,
        streams: list[RequestStream],
        builder: ResponseBuilder,
        *,
        include_usage: bool,
        record: RequestRecord | None = None,
        output: OutputSpec | None = None,
        count_tokens: Callable[[str], int] = len,
    ):
        self._streams = streams
        #: Counts a text's tokens: the split-out reasoning's, for ``usage``.
        self.count_tokens = count_tokens
        #: Chat choices whose text goes through output parsers: one parser per choice.
        self._outputs = (
            [ChoiceOutput(output, starts_in_reasoning=s.starts_in_reasoning) for s in streams] if output else None
        )
        self._builder = builder
        self._include_usage = include_usage
        self._record = record
        self._exit_stack = contextlib.AsyncExitStack()
        self._nursery: trio.Nursery | None = None
        self._events: AsyncIterator[str] | None = None
        self._error: str | None = None  # an in-band error was sent
        self._complete = False  # `data: [DONE]` was produced

    async def __aenter__(self) -> ChoicesSseBody:
        async with contextlib.AsyncExitStack() as stack:
            for stream in self._streams:
                stack.enter_context(stream)
            if len(self._streams) == 1:  # one choice: the writer reads it itself, one task hop less per token
                self._events = self._sse_events(_single_choice(self._streams[0], self._record))
            else:
                self._nursery = await stack.enter_async_context(trio.open_nursery())
                send, recv = trio.open_memory_channel[tuple[int, Delta | VllmMlxTrioError]](MERGE_BUFFER)
                with send:
                    for index, stream in enumerate(self._streams):
                        self._nursery.start_soon(_read_choice, index, stream, send.clone(), self._record)
                self._events = self._sse_events(_merged_choices(recv))
            self._exit_stack = stack.pop_all()
        return self

    def __aiter__(self) -> AsyncIterator[str]:
        assert self._events is not None, "iterate the body inside `async with`"
        return self._events

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()  # the response is over, finished or not
        if self._events is not None:
            await self._events.aclose()
        try:
            return await self._exit_stack.__aexit__(exc_type, exc, tb)
        finally:
            self._log_outcome(exc)

    def _log_outcome(self, exc: BaseException | None) -> None:
        """The request's line, once its streams are closed (their usage is final)."""
        if self._record is None:
            return
        self._record.stream_ended(exc, error=self._error, complete=self._complete)

    async def _sse_events(self, batches: AsyncIterator[list[ChoiceItem]]) -> AsyncIterator[str]:
        builder = self._builder
        started: set[int] = set()
        if builder.chat:
            for index in range(len(self._streams)):
                yield builder.role_chunk(index)
                started.add(index)
        async with contextlib.aclosing(batches):
            async for items in batches:
                events, failed = self._events_for(items, started)
                if events:
                    yield events
                if failed:
                    return
        if self._include_usage:
            usage = combined_usage([s.usage for s in self._streams])
            reasoning = sum(self.count_tokens(output.reasoning_text) for output in self._outputs or ())
            yield builder.usage_chunk(attrs.evolve(usage, reasoning_tokens=reasoning))
        self._complete = True
        yield SSE_DONE

    def _events_for(self, items: list[ChoiceItem], started: set[int]) -> tuple[str, bool]:
        """The SSE text for these items, and whether one was an error (which ends the body)."""
        events = []
        for index, item in items:
            if isinstance(item, VllmMlxTrioError):
                events.append(_error_event(item, self._streams[index]))
                self._error = error_code(item)
                return "".join(events), True
            if self._outputs is not None:
                events.extend(self._parsed_chunks(index, item, started))
            elif item.text or item.finish_reason is not None or item.logprobs or index not in started:
                started.add(index)
                events.append(self._builder.chunk(index, item.text, item.finish_reason, item.logprobs))
        return "".join(events), False

    def _parsed_chunks(self, index: int, item: Delta, started: set[int]) -> list[str]:
        """A parsed choice's chunks for one delta: one per parsed piece (the tokens' logprobs
        on the first, the finish reason on the last), or one empty delta for logprobs or the
        finish alone."""
        assert self._outputs is not None
        output = self._outputs[index]
        deltas = output.feed(item.text)
        finish_reason = None
        if item.finish_reason is not None:
            deltas += output.finish()
            finish_reason = output.finish_reason(item.finish_reason)
        if not deltas and (finish_reason is not None or item.logprobs or index not in started):
            deltas = [{}]
        started.add(index)
        last = len(deltas) - 1
        return [
            self._builder.delta_chunk(
                index, delta, finish_reason if i == last else None, item.logprobs if i == 0 else ()
            )
            for i, delta in enumerate(deltas)
        ]


async def _single_choice(stream: RequestStream, record: RequestRecord | None) -> AsyncIterator[list[ChoiceItem]]:
    """The one choice's deltas (or its error), each as a batch of one."""
    try:
        async for delta in stream:
            if record is not None:
                record.delta()
            yield [(0, delta)]
    except VllmMlxTrioError as exc:
        yield [(0, exc)]


async def _merged_choices(
    recv: trio.MemoryReceiveChannel[tuple[int, Delta | VllmMlxTrioError]],
) -> AsyncIterator[list[ChoiceItem]]:
    """The choices' deltas as their readers send them; whatever else is already waiting comes in
    the same batch, so a writer that falls behind sends fewer, larger socket writes instead of
    falling further."""
    with recv:
        async for first in recv:
            yield [first, *_drain_nowait(recv)]


def _drain_nowait(recv: trio.MemoryReceiveChannel) -> list:
    """Every item already in the channel, without waiting."""
    items = []
    while True:
        try:
            items.append(recv.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return items


async def _read_choice(
    index: int,
    stream: RequestStream,
    send: trio.MemorySendChannel[tuple[int, Delta | VllmMlxTrioError]],
    record: RequestRecord | None,
) -> None:
    """Forward one choice's deltas (or its error) to the merged stream, tagged by index."""
    with send, contextlib.suppress(trio.BrokenResourceError):
        # BrokenResourceError: the writer has stopped (another choice failed), nobody to tell.
        try:
            async for delta in stream:
                if record is not None:
                    record.delta()
                await send.send((index, delta))
        except VllmMlxTrioError as exc:
            await send.send((index, exc))


def _error_event(exc: VllmMlxTrioError, stream: RequestStream) -> str:
    _status, body, _headers = describe(exc)
    logger.warning("request %s failed mid-stream: %s", stream.request_id, exc)
    return sse(body)
