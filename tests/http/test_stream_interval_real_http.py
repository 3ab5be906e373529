"""The stream interval over HTTP on the real demo model, plans running ahead: the OpenAI chat
stream carries one token per chunk at interval 1 (its logprobs count them) and the first token
alone, then 4 at a time, at interval 4; Anthropic's ``text_delta`` events and the Responses API's
``output_text.delta`` events cut the same greedy reply at the same places."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import engine as engine_module
from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import open_server
from vllm_mlx_trio.worker.batched import runner as batch_runner

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
USER = [{"role": "user", "content": "Tell me a long story about the sea."}]
MAX_TOKENS = 64
TIMEOUT_S = 180
#: Plans run ahead as far as the steps bound allows (no window ends them first).
RUN_AHEAD = {"run_ahead_steps": 8, "run_ahead_ms": 60000.0, "solo_run_ahead_steps": 16, "solo_run_ahead_ms": 60000.0}
#: An outbox this deep never fills within one reply, so a reader held up by a busy machine never
#: sees tokens coalesced: every chunk is the interval's.
WIDE_OUTBOX = MAX_TOKENS + 2


def expected_sizes(interval: int, num_tokens: int) -> list[int]:
    rest = num_tokens - 1
    return [1] + [interval] * (rest // interval) + ([rest % interval] if rest % interval else [])


@pytest.fixture
def wide_outbox(monkeypatch):
    monkeypatch.setattr(engine_module, "OUTBOX_BUFFER", WIDE_OUTBOX)


@pytest.fixture
def published(monkeypatch) -> list[int]:
    """How many rows each step handed over while its plan ran on had (run-ahead happened)."""
    seen: list[int] = []
    publish = batch_runner.BatchRunner._publish

    def counted(runner, advance):
        seen.append(len(advance.emissions))
        return publish(runner, advance)

    monkeypatch.setattr(batch_runner.BatchRunner, "_publish", counted)
    return seen


def server_cfg(demo_cfg, interval: int):
    """The demo server with plans running ahead, and no output parser holding text back (the
    pieces are the delivery's own)."""
    engine = attrs.evolve(demo_cfg.engine, stream_interval=interval, **RUN_AHEAD)
    model = attrs.evolve(demo_cfg.model, tool_parser="none", reasoning_parser="none")
    return attrs.evolve(demo_cfg, engine=engine, model=model)


async def openai_chunks(url: str) -> tuple[list[int], list[str]]:
    """Tokens per content chunk (from its logprobs) and each chunk's text."""
    async with openai_client(url) as c:
        stream = await c.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=MAX_TOKENS, temperature=0, logprobs=True, stream=True
        )
        chunks = [chunk.choices[0] async for chunk in stream if chunk.choices and chunk.choices[0].logprobs]
    return [len(c.logprobs.content) for c in chunks], [c.delta.content or "" for c in chunks]


async def anthropic_pieces(url: str) -> list[str]:
    async with anthropic_client(url) as c:
        greedy = {"temperature": 0}  # the SDK's stream() takes it in the body
        async with c.messages.stream(model=MODEL, max_tokens=MAX_TOKENS, messages=USER, extra_body=greedy) as stream:
            return [
                event.delta.text
                async for event in stream
                if event.type == "content_block_delta" and event.delta.type == "text_delta"
            ]


async def responses_pieces(url: str) -> list[str]:
    async with openai_client(url) as c:
        async with c.responses.stream(model=MODEL, input=USER, max_output_tokens=MAX_TOKENS, temperature=0) as stream:
            return [event.delta async for event in stream if event.type == "response.output_text.delta"]


@pytest.mark.parametrize("interval", [1, 4])
async def test_every_api_streams_by_the_interval_while_plans_run_ahead(demo_cfg, wide_outbox, published, interval):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(server_cfg(demo_cfg, interval)) as srv:
            sizes, texts = await openai_chunks(srv.url)
            anthropic = await anthropic_pieces(srv.url)
            responses = await responses_pieces(srv.url)
    num_tokens = sum(sizes)
    assert num_tokens > MAX_TOKENS // 2  # the random model rarely ends early; the cut is checked either way
    assert sizes == expected_sizes(interval, num_tokens)
    assert len(published) >= 3 * (num_tokens // 8)  # each API's plans ran several steps
    pieces = [text for text in texts if text]
    assert anthropic == pieces
    assert responses == pieces
