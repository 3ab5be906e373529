"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API)."""

from __future__ import annotations

import quart

from ...engine import Engine
from ..body import read_json_body
from ..model_names import ServedNames
from ..one_request import OneRequestRunner
from .count import TokenCounter
from .errors import MESSAGES_PATH, register_error_shape
from .message import MessageEvents, full_message
from .tools import marker_ids
from .translate import parse_count_tokens, parse_messages

#: Seconds without an event before a ``ping``: Anthropic's clients expect one at least every
#: 10 s while a long prefill runs; half of that leaves room for a busy event loop.
PING_INTERVAL_S = 5.0


def register_anthropic_routes(app: quart.Quart, engine: Engine) -> None:
    model_names = ServedNames.from_config(engine.cfg)
    runner = OneRequestRunner(engine)
    counter = TokenCounter(engine.model_info.tokenizer)
    markers = marker_ids(engine.model_info.tokenizer, engine.output_format.reasoning_markers)
    register_error_shape(app)

    @app.post(MESSAGES_PATH)
    async def messages():
        with runner.record() as (record, ids):
            body = await read_json_body()
            parsed = parse_messages(body, model_names=model_names, output=engine.output_format, markers=markers)
            stream = await runner.submit(record, ids, parsed.prompt, parsed.params)
            if parsed.stream:
                return runner.streaming_response(
                    stream,
                    MessageEvents(body["model"], parsed.output, omit_thinking=parsed.omit_thinking),
                    record,
                    ping_interval_s=PING_INTERVAL_S,
                )
            outcome = await runner.collect(stream, record)
            return full_message(
                model=body["model"],
                text=outcome.text,
                finish_reason=outcome.finish_reason,
                stop_sequence=outcome.stop_sequence,
                usage=stream.usage,
                output=parsed.output,
                starts_in_reasoning=stream.starts_in_reasoning,
                omit_thinking=parsed.omit_thinking,
            )

    @app.post(f"{MESSAGES_PATH}/count_tokens")
    async def count_tokens():
        # ``?beta=true`` (sent by some clients) changes nothing here.
        prompt, prefill = parse_count_tokens(
            await read_json_body(), model_names=model_names, output=engine.output_format
        )
        return {"input_tokens": await counter.count(prompt, prefill=prefill)}
