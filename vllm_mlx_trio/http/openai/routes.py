"""The OpenAI routes: chat and text completions (streaming and not) and the model list.

A request for ``n`` choices runs ``n`` engine requests of the same prompt. With a ``seed``,
choice ``i`` samples with ``seed + i`` (wrapped into the signed 64-bit range), so the
choices differ yet the whole response is reproducible; choice 0 uses the seed as given.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from functools import partial

import attrs
import quart
import trio

from ...core.params import SamplingParams
from ...engine import Engine
from ...errors import VllmMlxTrioError
from ...messages import TokenLogprob
from ...stream import RequestStream
from ..agent_output import ChoiceOutput, OutputSpec, count_text_tokens, output_spec
from ..body import read_json_body
from ..model_names import ServedNames
from ..request_log import (
    REQUEST_ID_HEADER,
    EngineIds,
    RequestRecord,
    request_id_from,
)
from ..request_streams import owned_by_request
from .choices_sse import ChoicesSseBody
from .extensions import extended_builder
from .requests import ParsedRequest, parse_chat, parse_completion
from .responses import ChoiceResult, combined_usage

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
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
        # each named adapter, its base as ``parent`` (vLLM's LoRA cards)
        paths = dict(engine.cfg.model.adapters)
        cards += [
            {**cards[0], "id": served, "root": paths[adapter], "parent": engine.cfg.model_name}
            for served, adapter in model_names.adapters.items()
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


def input_modalities(media_kinds: frozenset[str]) -> list[str]:
    """``/v1/models``' ``input_modalities``: "text", then "image" / "video" as the model takes them."""
    return ["text", *(kind for kind in ("image", "video") if f"{kind}_url" in media_kinds)]
