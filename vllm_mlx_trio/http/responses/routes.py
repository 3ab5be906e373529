"""``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}`` (OpenAI's Responses API)."""

from __future__ import annotations

from functools import partial
from typing import Any

import quart

from ...engine import Engine
from ...messages import CalledTool, ChatMessage
from ..agent_output import count_text_tokens
from ..body import read_json_body
from ..errors import error_body
from ..model_names import ServedNames
from ..one_request import OneRequestRunner
from .response import ResponseBuilder, ResponseEvents
from .store import ResponseStore, StoredResponse
from .translate import parse_responses

RESPONSES_PATH = "/v1/responses"
#: Seconds without an event before an SSE comment line keeps the connection alive.
KEEP_ALIVE_S = 5.0


def not_found(response_id: str, param: str | None = None) -> tuple[dict, int]:
    message = f"Response with id '{response_id}' not found."
    return error_body(message, type="invalid_request_error", param=param, code="not_found"), 404


def answer_turn(output: list[dict[str, Any]]) -> ChatMessage:
    """The assistant turn a response's output items make in the stored conversation: its
    text and its calls (reasoning is dropped, as chat templates drop earlier reasoning)."""
    text = "".join(item["content"][0]["text"] for item in output if item["type"] == "message")
    calls = tuple(
        CalledTool(id=item["call_id"], name=item["name"], arguments=item["arguments"])
        for item in output
        if item["type"] == "function_call"
    )
    return ChatMessage(role="assistant", content=text, tool_calls=calls)


def register_responses_routes(app: quart.Quart, engine: Engine) -> None:
    model_names = ServedNames.from_config(engine.cfg)
    runner = OneRequestRunner(engine)
    store = ResponseStore(engine.cfg.limits.max_stored_responses)

    @app.post(RESPONSES_PATH)
    async def create_response():
        with runner.record() as (record, ids):
            request = parse_responses(await read_json_body(), model_names=model_names, output=engine.output_format)
            history: tuple[ChatMessage, ...] = ()
            if (previous_id := request.body.previous_response_id) is not None:
                previous = store.get(previous_id)
                if previous is None:
                    record.finish("error", error="not_found")
                    return not_found(previous_id, "previous_response_id")
                history = previous.conversation
            builder = ResponseBuilder(
                request, request.body.model, partial(count_text_tokens, engine.model_info.tokenizer)
            )
            stream = await runner.submit(record, ids, request.prompt(history), request.params)

            def keep(final: dict[str, Any]) -> None:
                if request.store:
                    conversation = (*history, *request.turns, answer_turn(final["output"]))
                    store.put(builder.id, StoredResponse(response=final, conversation=conversation))

            if request.stream:
                events = ResponseEvents(builder, keep)
                return runner.streaming_response(stream, events, record, ping_interval_s=KEEP_ALIVE_S)
            outcome = await runner.collect(stream, record)
            final = builder.full(
                outcome.text, outcome.finish_reason, stream.usage, starts_in_reasoning=stream.starts_in_reasoning
            )
            keep(final)
            return final

    @app.get(f"{RESPONSES_PATH}/<response_id>")
    async def get_response(response_id: str):
        entry = store.get(response_id)
        return not_found(response_id) if entry is None else entry.response

    @app.delete(f"{RESPONSES_PATH}/<response_id>")
    async def delete_response(response_id: str):
        if not store.delete(response_id):
            return not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}
