"""A GGUF file served by the real server answers a greedy chat as mlx-lm answers it from the
original model's folder."""

from __future__ import annotations

import mlx_lm
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
MAX_TOKENS = 16
CHAT = [{"role": "user", "content": "Tell me about the sea and the boats."}]


def reference_reply(folder) -> str:
    """mlx-lm's greedy reply from the original model, on the same chat-templated prompt."""
    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=MAX_TOKENS)


async def test_served_llama_file_answers_as_mlx_lm_on_the_original(builds):
    gguf = builds.gguf("llama")
    overrides = ["server.port=0", f"model.path={gguf}", f"model.demo_cache_dir={builds.cache_dir}"]
    cfg = load_config(None, overrides=overrides, environ={})
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, openai_client(srv.url) as client:
            reply = await client.chat.completions.create(
                model=cfg.model_name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
            )
    text = reply.choices[0].message.content
    assert text and text == reference_reply(builds.reference("llama"))
    assert reply.usage.completion_tokens == MAX_TOKENS
