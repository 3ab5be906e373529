"""Named adapters over HTTP on the real server: listed in /v1/models with their parent, answered
under their own names on all three APIs with the adapter's greedy output (the official clients),
an unknown adapter name a 404 in each API's shape, even when any model name is accepted."""

from __future__ import annotations

import anthropic
import mlx_lm
import openai
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import open_server
from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.demo.adapter import resolve_demo_adapter

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
MAX_TOKENS = 8
CHAT = [{"role": "user", "content": "Tell me about the sea and the boats."}]


def reference_reply(demo_cache_dir: str, adapter: str | None) -> str:
    """mlx-lm's greedy reply loading ``adapter`` alone (None: the base), on the chat-templated prompt."""
    folder = None if adapter is None else str(resolve_demo_adapter(adapter, demo_cache_dir))
    model, tokenizer = mlx_lm.load(str(resolve_demo_model("demo:tiny", demo_cache_dir)), adapter_path=folder)
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS)


async def test_adapters_are_listed_answered_by_name_and_unknown_ones_are_404(demo_cache_dir):
    overrides = [
        "server.port=0",
        "server.accept_any_model_name=true",
        f"model.demo_cache_dir={demo_cache_dir}",
        'model.adapters={ a = "demo:tiny-lora", b = "demo:tiny-lora-b" }',
    ]
    cfg = load_config(None, overrides=overrides, environ={})
    replies = {}
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as oa, anthropic_client(srv.url) as an:
            cards = {card.id: card async for card in oa.models.list()}

            async def chat(name: str) -> None:
                reply = await oa.chat.completions.create(
                    model=name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
                )
                replies[name] = (reply.model, reply.choices[0].message.content)

            async with trio.open_nursery() as nursery:  # one batch: the base and both adapters
                for name in ("demo:tiny", "demo:tiny:a", "demo:tiny:b"):
                    nursery.start_soon(chat, name)
            message = await an.messages.create(
                model="demo:tiny:a", messages=CHAT, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}
            )
            response = await oa.responses.create(
                model="demo:tiny:b", input=CHAT, max_output_tokens=MAX_TOKENS, temperature=0
            )
            with pytest.raises(openai.NotFoundError) as oa_missing:
                await oa.chat.completions.create(model="demo:tiny:c", messages=CHAT, max_tokens=3)
            with pytest.raises(anthropic.NotFoundError) as an_missing:
                await an.messages.create(model="demo:tiny:c", messages=CHAT, max_tokens=3)
    assert list(cards) == ["demo:tiny", "demo:tiny:a", "demo:tiny:b"]
    assert cards["demo:tiny:a"].parent == "demo:tiny" and cards["demo:tiny:b"].root == "demo:tiny-lora-b"
    want = {
        name: reference_reply(demo_cache_dir, path)
        for name, path in (("demo:tiny", None), ("demo:tiny:a", "demo:tiny-lora"), ("demo:tiny:b", "demo:tiny-lora-b"))
    }
    assert len(set(want.values())) == 3  # the adapters change the reply, each its own way
    assert replies == {name: (name, text) for name, text in want.items()}
    assert (message.model, message.content[0].text) == ("demo:tiny:a", want["demo:tiny:a"])
    assert (response.model, response.output_text) == ("demo:tiny:b", want["demo:tiny:b"])
    assert oa_missing.value.body["code"] == "model_not_found"
    assert an_missing.value.body["type"] == "error" and "demo:tiny:c" in an_missing.value.body["error"]["message"]
