"""vLLM's ``/tokenize`` and ``/detokenize`` on the real demo model's tokenizer."""

from __future__ import annotations

import httpx
import pytest
import trio

from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import open_server

pytestmark = pytest.mark.mlx

MODEL = "demo:tiny"
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
TIMEOUT_S = 120


async def test_tokenize_matches_what_the_routes_prefill_and_detokenize_inverts_it(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            tokenizer = srv.engine.model_info.tokenizer
            chat = (await http.post("/tokenize", json={"model": MODEL, "messages": CHAT})).json()
            async with openai_client(srv.url) as client:
                reply = await client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
            continued = (
                await http.post(
                    "/tokenize",
                    json={
                        "messages": [*CHAT, {"role": "assistant", "content": "It is"}],
                        "continue_final_message": True,
                        "add_generation_prompt": False,
                    },
                )
            ).json()
            text = (await http.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True})).json()
            plain = (await http.post("/tokenize", json={"prompt": "Hello world", "add_special_tokens": False})).json()
            back = (await http.post("/detokenize", json={"model": MODEL, "tokens": text["tokens"]})).json()
    rendered = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    assert chat["count"] == len(chat["tokens"]) == reply.usage.prompt_tokens
    assert chat["max_model_len"] == srv.engine.model_info.max_context_tokens and chat["token_strs"] is None
    assert tokenizer.decode(continued["tokens"]).endswith("It is")
    assert text["tokens"] == tokenizer.encode("Hello world")
    assert text["token_strs"] == tokenizer.convert_ids_to_tokens(text["tokens"])
    assert plain["tokens"] == tokenizer.encode("Hello world", add_special_tokens=False)
    assert back == {"prompt": tokenizer.decode(text["tokens"])}
    assert "Hello world" in back["prompt"]


async def test_tokenize_errors(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            vocab = srv.engine.model_info.vocab_size
            cases = [
                ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "prompt"),
                ("/tokenize", {}, 400, "prompt"),
                ("/tokenize", {"prompt": 3}, 400, "prompt"),
                ("/tokenize", {"prompt": "a", "bogus": 1}, 400, "bogus"),
                ("/tokenize", {"messages": CHAT, "chat_template": "{{ 1 }}"}, 400, "chat_template"),
                ("/tokenize", {"messages": [{"role": "nobody", "content": "x"}]}, 400, "messages[0].role"),
                ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model"),
                ("/detokenize", {"tokens": [1, vocab]}, 400, "tokens[1]"),
                ("/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
            ]
            answers = [await http.post(path, json=body) for path, body, _, _ in cases]
    for (path, body, status, param), answer in zip(cases, answers, strict=True):
        assert answer.status_code == status, (path, body, answer.text)
        error = answer.json()["error"]
        assert error["param"] == param, (path, body, error)
