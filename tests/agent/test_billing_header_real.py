"""Claude Code's billing header changes on every request (``cch``, the version's suffix); the
server makes it stable, so a session's second turn reuses the first turn's prompt from the
prefix cache. The three APIs it reaches, each through its official SDK, on the real demo model."""

from __future__ import annotations

import pytest
import trio

from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
TIMEOUT_S = 180
#: Claude Code's system prompt after the header: long enough to fill several prefix-cache blocks.
RULES = " ".join(f"Rule {i}: read the file before you edit it, and keep the diff small." for i in range(30))
QUESTION = "What does the function parse_args return?"
#: Prefix-cache blocks are 64 tokens: at most this many prompt tokens are left to compute on a hit.
BLOCK = 64


def header(cch: str, suffix: str) -> str:
    return f"x-anthropic-billing-header: cc_version=2.1.37.{suffix}; cc_entrypoint=cli; cch={cch};"


async def anthropic_turn(url: str, cch: str, suffix: str) -> tuple[int, int]:
    """(prompt tokens, of them read from the cache) of one turn, the header its own system block."""
    system = [{"type": "text", "text": header(cch, suffix)}, {"type": "text", "text": RULES}]
    async with anthropic_client(url) as client:
        message = await client.messages.create(
            model=MODEL, max_tokens=4, system=system, messages=[{"role": "user", "content": QUESTION}]
        )
    usage = message.usage
    return usage.input_tokens + usage.cache_read_input_tokens, usage.cache_read_input_tokens


async def chat_turn(url: str, cch: str, suffix: str) -> tuple[int, int]:
    """The same through chat completions, as a proxy flattens it: the header is the system text's first line."""
    messages = [
        {"role": "system", "content": header(cch, suffix) + "\n" + RULES},
        {"role": "user", "content": QUESTION},
    ]
    async with openai_client(url) as client:
        reply = await client.chat.completions.create(model=MODEL, max_tokens=4, messages=messages)
    usage = reply.usage
    return usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens


async def responses_turn(url: str, cch: str, suffix: str) -> tuple[int, int]:
    """The same through the Responses API, the header at the start of ``instructions``."""
    async with openai_client(url) as client:
        response = await client.responses.create(
            model=MODEL, max_output_tokens=16, instructions=header(cch, suffix) + "\n" + RULES, input=QUESTION
        )
    usage = response.usage
    return usage.input_tokens, usage.input_tokens_details.cached_tokens


@pytest.mark.parametrize("turn", [anthropic_turn, chat_turn, responses_turn])
async def test_the_next_turn_reuses_the_prompt_though_the_header_changed(demo_cfg, turn):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            first_tokens, first_cached = await turn(srv.url, "fa690", "0d9")
            second_tokens, second_cached = await turn(srv.url, "36ee5", "a1f")
    assert first_cached == 0 and second_tokens == first_tokens > 4 * BLOCK
    assert second_cached > second_tokens - BLOCK  # every full block of the prompt, header included


async def test_a_header_in_a_users_message_is_not_rewritten(demo_cfg):
    """Text sent by the user is the model's to read as given: a cch inside it changes the prompt."""

    async def turn(url: str, cch: str) -> tuple[int, int]:
        messages = [{"role": "user", "content": header(cch, "0d9") + "\n" + RULES}]
        async with openai_client(url) as client:
            reply = await client.chat.completions.create(model=MODEL, max_tokens=4, messages=messages)
        return reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens

    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv:
            await turn(srv.url, "fa690")
            _tokens, cached = await turn(srv.url, "36ee5")
    assert cached < BLOCK  # the prompts part within the first block
