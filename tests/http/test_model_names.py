"""Model names: aliases listed and answered on all three APIs, any name when opted in, else 404."""

from __future__ import annotations

import anthropic
import attrs
import openai
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.clients import anthropic_client, openai_client
from vllm_mlx_trio.testing.harness import fake_server

CHAT = [{"role": "user", "content": "hi"}]
ALIASES = ["claude-sonnet-4-5", "claude-haiku-4-5"]


def names_cfg(*overrides: str):
    base = ["server.port=0", "server.drain_timeout_s=5"]
    return load_config(None, overrides=[*base, *overrides], environ={})


async def answers(url: str, model: str) -> tuple[str, str, str]:
    """The ``model`` each API's reply carries for a request naming ``model``."""
    async with openai_client(url) as oa, anthropic_client(url) as an:
        chat = await oa.chat.completions.create(model=model, messages=CHAT, max_tokens=3)
        message = await an.messages.create(model=model, messages=CHAT, max_tokens=3)
        response = await oa.responses.create(model=model, input="hi", max_output_tokens=3)
    return chat.model, message.model, response.model


async def test_aliases_are_listed_and_each_is_answered_under_its_own_name():
    cfg = names_cfg('model.aliases=["claude-sonnet-4-5", "claude-haiku-4-5"]')
    with trio.fail_after(30):
        async with fake_server(cfg) as srv:
            async with openai_client(srv.url) as oa:
                listed = [card.id async for card in oa.models.list()]
                for alias in ALIASES:
                    assert await answers(srv.url, alias) == (alias, alias, alias)
                with pytest.raises(openai.NotFoundError):
                    await oa.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=3)
            async with anthropic_client(srv.url) as an:
                with pytest.raises(anthropic.NotFoundError) as caught:
                    await an.messages.create(model="claude-opus-4-1", messages=CHAT, max_tokens=3)
    assert listed == ["demo:tiny", *ALIASES]
    assert caught.value.body["type"] == "error" and "claude-opus-4-1" in caught.value.body["error"]["message"]


async def test_accept_any_model_name_answers_every_name_and_echoes_it():
    cfg = names_cfg("server.accept_any_model_name=true")
    with trio.fail_after(30):
        async with fake_server(cfg) as srv:
            async with openai_client(srv.url) as oa:
                listed = [card.id async for card in oa.models.list()]
            echoed = await answers(srv.url, "qwen3-coder-30b")
    assert listed == ["demo:tiny"]
    assert echoed == ("qwen3-coder-30b",) * 3


def test_aliases_must_be_distinct_non_empty_names():
    with pytest.raises(Exception, match="aliases"):
        names_cfg('model.aliases=["a", "a"]')
    with pytest.raises(Exception, match="aliases"):
        names_cfg('model.aliases=[""]')
    cfg = names_cfg('model.aliases=["demo:tiny", "b"]')
    assert cfg.served_names == ("demo:tiny", "b") and attrs.has(type(cfg))
