"""The OpenAI routes: chat and text completions (streaming and not) and the model list.

A request for ``n`` choices runs ``n`` engine requests of the same prompt. With a ``seed``,
choice ``i`` samples with ``seed + i`` (wrapped into the signed 64-bit range), so the
choices differ yet the whole response is reproducible; choice 0 uses the seed as given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from types import TracebackType

import attrs
import quart
import trio
from quart.wrappers.response import ResponseBody

from ...core.params import SamplingParams
from ...engine import Engine
from ...errors import VllmMlxTrioError
from ...messages import TokenLogprob
from ...stream import Delta, RequestStream
from ..agent_output import ChoiceOutput, OutputSpec, count_text_tokens, output_spec
from ..body import read_json_body
from ..errors import describe
from ..model_names import ServedNames
from ..request_log import (
    REQUEST_ID_HEADER,
    EngineIds,
    RequestRecord,
    error_code,
    request_id_from,
)
from ..request_streams import owned_by_request
from .extensions import extended_builder
from .requests import ParsedRequest, parse_chat, parse_completion
from .responses import SSE_DONE, ChoiceResult, ResponseBuilder, combined_usage, sse

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: Deltas waiting between the choices' readers and the socket writer. A few let every choice
#: keep reading while one chunk is written; beyond that the readers wait, their outboxes fill
#: and the scheduler coalesces their tokens, so a slow client never grows this buffer.
MERGE_BUFFER = 8
#: One choice's delta, or the error that ended it, by choice index.
ChoiceItem = tuple[int, Delta | VllmMlxTrioError]
_SEED_SPAN = 2**64
_SEED_MIN = -(2**63)


def register_routes(app: quart.Quart, engine: Engine) -> None:
    model_names = ServedNames.from_config(engine.cfg)
    max_n = engine.cfg.limits.max_n
    unknown_fields = engine.cfg.server.unknown_fields
    engine_ids = EngineIds(engine)
    tool_parser = engine.output_format.tool_parser

    @app.post("/v1/chat/completions")
    async def chat_completions():
        return await handle(chat=True)

    @app.post("/v1/completions")
    async def completions():
        return await handle(chat=False)

    @app.get("/v1/models")
    async def models():
        # which inputs the model takes: text, and images / videos for a VLM
        modalities = input_modalities(engine.model_info.media_kinds)
        # prompt + completion tokens one request may hold (vLLM's max_model_len; model.max_model_len caps it)
        max_model_len = engine.model_info.max_context_tokens
        cards = [
            {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "vllm-mlx-trio",
                "max_model_len": max_model_len,
                "input_modalities": modalities,
            }
            for name in model_names.names
        ]
        return {"object": "list", "data": cards}

    async def handle(*, chat: bool):
        ids: list[str] = []  # the engine's ids for the choices, once the body is parsed
        request_id = quart.g.get("request_id") or request_id_from(quart.request.headers.get(REQUEST_ID_HEADER))
        record = RequestRecord(
            request_id, quart.request.path, engine.metrics, on_finish=lambda: engine_ids.release(ids)
        )
        with record.outcome():
            body = await read_json_body()
            if chat:
                parsed = parse_chat(
                    body, model_names=model_names, max_n=max_n, tool_parser=tool_parser, unknown_fields=unknown_fields
                )
            else:
                parsed = parse_completion(body, model_names=model_names, max_n=max_n, unknown_fields=unknown_fields)
            ids.extend(engine_ids.reserve(record.request_id, parsed.n))
            return await _complete(engine, parsed, record, ids, chat=chat)


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """Choice ``index``'s params: ``seed + index`` when seeded, wrapped into 64 bits."""
    if params.seed is None or index == 0:
        return params
    seed = (params.seed + index - _SEED_MIN) % _SEED_SPAN + _SEED_MIN
    return attrs.evolve(params, seed=seed)


async def _complete(engine: Engine, parsed: ParsedRequest, record: RequestRecord, ids: list[str], *, chat: bool):
    """Run the choices; a streaming response's body finishes ``record``, otherwise this does."""
    builder = extended_builder(parsed, chat=chat, model=parsed.model, tokenizer=engine.model_info.tokenizer)
    spec = _output_spec(engine, parsed) if chat else None
    count_tokens = partial(count_text_tokens, engine.model_info.tokenizer)
    record.submitting()
    streams = await _submit_choices(engine, parsed, ids, endpoint=record.endpoint)
    record.streams = streams
    if not parsed.stream:
        with contextlib.ExitStack() as opened:
            for stream in streams:
                opened.enter_context(stream)
            results = await _collect_choices(streams, record)
        record.finish("ok")
        if spec is not None:
            results = [
                _parsed_choice(result, spec, stream, count_tokens)
                for result, stream in zip(results, streams, strict=True)
            ]
        usage = combined_usage([s.usage for s in streams])
        reasoning_tokens = sum(result.reasoning_tokens for result in results)
        return builder.full(results, attrs.evolve(usage, reasoning_tokens=reasoning_tokens))
    body = ChoicesSseBody(
        streams, builder, include_usage=parsed.include_usage, record=record, output=spec, count_tokens=count_tokens
    )
    response = quart.Response(
        body,
        mimetype="text/event-stream",
        headers=SSE_HEADERS,
    )
    response.timeout = None  # Quart's 60 s response timeout must not cut long streams
    return response


def _output_spec(engine: Engine, parsed: ParsedRequest) -> OutputSpec | None:
    """How a chat request's choices are parsed (None: not at all, the text is the content)."""
    use = parsed.tools
    ext = parsed.extensions
    return output_spec(
        engine.output_format,
        tools=use.tools if use else None,
        parse_calls=bool(use and use.parse_calls),
        parallel=use.parallel if use else True,
        reasoning=(ext.include_reasoning, ext.separate_reasoning, ext.stream_reasoning),
        tool_parser=use.parser if use else None,
    )


def _parsed_choice(
    result: ChoiceResult, spec: OutputSpec, stream: RequestStream, count_tokens: Callable[[str], int]
) -> ChoiceResult:
    """A non-streamed choice through the same parser a stream goes through."""
    output = ChoiceOutput(spec, starts_in_reasoning=stream.starts_in_reasoning)
    output.feed(result.text)
    output.finish()
    return attrs.evolve(
        result,
        message=output.message(),
        finish_reason=output.finish_reason(result.finish_reason),
        reasoning_tokens=count_tokens(output.reasoning_text),
    )


async def _submit_choices(
    engine: Engine, parsed: ParsedRequest, ids: list[str], *, endpoint: str
) -> list[RequestStream]:
    """Submit one engine request per choice; if one is refused, close those already open."""
    with contextlib.ExitStack() as opened:
        streams = []
        for index, request_id in enumerate(ids):
            params = choice_params(parsed.params, index)
            stream = await engine.submit(parsed.prompt, params, request_id=request_id, endpoint=endpoint)
            streams.append(opened.enter_context(owned_by_request(stream)))
        opened.pop_all()
    return streams


async def _collect_choices(streams: list[RequestStream], record: RequestRecord) -> list[ChoiceResult]:
    """Read every choice to its end, concurrently; the first choice's error is raised."""
    results: list[ChoiceResult] = []
    failures: list[VllmMlxTrioError] = []

    async def collect(index: int, stream: RequestStream) -> None:
        try:
            results.append(await _collect(index, stream, record))
        except VllmMlxTrioError as exc:
            failures.append(exc)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for index, stream in enumerate(streams):
            nursery.start_soon(collect, index, stream)
    if failures:
        raise failures[0]
    return sorted(results, key=lambda result: result.index)


async def _collect(index: int, stream: RequestStream, record: RequestRecord) -> ChoiceResult:
    texts: list[str] = []
    logprobs: list[TokenLogprob] = []
    async for delta in stream:
        record.delta()
        texts.append(delta.text)
        logprobs.extend(delta.logprobs)
    return ChoiceResult(index=index, text="".join(texts), finish_reason=stream.finish_reason, logprobs=tuple(logprobs))


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


def input_modalities(media_kinds: frozenset[str]) -> list[str]:
    """``/v1/models``' ``input_modalities``: "text", then "image" / "video" as the model takes them."""
    return ["text", *(kind for kind in ("image", "video") if f"{kind}_url" in media_kinds)]
