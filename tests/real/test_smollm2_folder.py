"""demo:smollm2's GGUF file served directly against mlx-lm's own loading of the same weights
converted to an mlx-lm folder (safetensors, config.json with the quantization, the tokenizer):
greedy replies equal, packed and dequantized to float32."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
import trio
from smollm2_helpers import PARIS, QUESTIONS, TIMEOUT_S, chat, post_chat, smollm2_config

from vllm_mlx_trio.testing.harness import open_server

pytestmark = [pytest.mark.mlx, pytest.mark.smollm2]

#: What mlx-lm's convert writes for a 4-bit model; layers packed otherwise (the 8-bit embedding)
#: are told by their shapes when mlx-lm loads.
QUANTIZATION = {"group_size": 32, "bits": 4}


@pytest.fixture(scope="module")
def converted(smollm2_cfg, tmp_path_factory):
    """The GGUF file's tensors saved as an mlx-lm folder; loaded by ``mlx_lm.load`` alone."""
    import mlx.core as mx
    import mlx_lm

    from vllm_mlx_trio.worker.gguf import open_gguf_model
    from vllm_mlx_trio.worker.gguf.weights import read_tensors
    from vllm_mlx_trio.worker.loading import resolve_model_path

    gguf = open_gguf_model(resolve_model_path(smollm2_cfg.model), tmp_path_factory.mktemp("sidecar"))
    folder = tmp_path_factory.mktemp("smollm2-folder")
    mx.save_safetensors(str(folder / "model.safetensors"), read_tensors(gguf.header, gguf.config))
    config = {**json.loads((gguf.folder / "config.json").read_text()), "quantization": QUANTIZATION}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(gguf.folder / name, folder / name)
    return mlx_lm.load(str(folder))


def folder_greedy(converted, messages) -> str:
    import mlx_lm

    model, tokenizer = converted
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return mlx_lm.generate(model, tokenizer, prompt, max_tokens=32)


def test_mlx_lm_loads_the_converted_folder_packed(converted):
    import mlx.nn as nn

    model, _tokenizer = converted
    embedding, first_q = model.model.embed_tokens, model.model.layers[0].self_attn.q_proj
    assert isinstance(embedding, nn.QuantizedEmbedding) and embedding.bits == 8
    assert isinstance(first_q, nn.QuantizedLinear) and (first_q.bits, first_q.group_size) == (4, 32)


async def test_served_packed_equals_mlx_lm_on_the_converted_folder(smollm2_cfg, converted):
    cfg = smollm2_config(smollm2_cfg.model.demo_cache_dir, "model.gguf_dtype=native")
    expected = [folder_greedy(converted, chat(question)) for question in QUESTIONS]
    assert PARIS in expected[0]
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(timeout=TIMEOUT_S) as http:
            replies = [await post_chat(http, srv.url, chat(question)) for question in QUESTIONS]
    assert [reply["choices"][0]["message"]["content"] for reply in replies] == expected


def test_the_default_dtype_answers_as_the_folder(converted, reference):
    """gguf_dtype = "auto": float32 under MKL, packed without it."""
    for question in QUESTIONS:
        assert reference.greedy(chat(question)).text == folder_greedy(converted, chat(question))
