"""``/v1/embeddings`` on the random-weight embedding demo (``demo:embed-tiny``, ``engine.mode =
"embed"``) through the official openai client, against vectors computed here from mlx-lm's
model directly."""

from __future__ import annotations

import base64

import httpx
import mlx.core as mx
import mlx_lm
import numpy as np
import openai
import pytest
import trio

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.http.openai.embeddings import check_dimensions
from vllm_mlx_trio.messages import EmbeddingInfo
from vllm_mlx_trio.testing.clients import openai_client
from vllm_mlx_trio.testing.harness import fake_server, open_server
from vllm_mlx_trio.worker.demo import resolve_demo_model

pytestmark = pytest.mark.mlx

MODEL = "demo:embed-tiny"
TEXTS = ["hello world", "a much longer sentence about the weather and the sea", "x"]
TIMEOUT_S = 120


def embed_cfg(demo_cache_dir: str, *extra: str):
    overrides = ["server.port=0", f"model.path={MODEL}", "engine.mode=embed", f"model.demo_cache_dir={demo_cache_dir}"]
    return load_config(None, overrides=[*overrides, *extra], environ={})


def reference(demo_cache_dir: str, texts: list[str], *, pooling: str = "last", dims: int | None = None):
    """mlx-lm's model alone, one text at a time: pooled hidden states, cut, normalised."""
    model, tokenizer = mlx_lm.load(str(resolve_demo_model(MODEL, demo_cache_dir)))
    vectors = []
    for text in texts:
        hidden = model.model(mx.array([tokenizer.encode(text)]))[0].astype(mx.float32)
        pooled = np.array(hidden[-1] if pooling == "last" else hidden.mean(axis=0))[:dims]
        vectors.append(pooled / np.linalg.norm(pooled))
    return np.array(vectors)


async def test_vectors_equal_mlx_lm_alone_batched_across_requests(demo_cache_dir):
    want = reference(demo_cache_dir, TEXTS)
    cut = reference(demo_cache_dir, TEXTS[:1], dims=16)
    with trio.fail_after(TIMEOUT_S):
        async with open_server(embed_cfg(demo_cache_dir)) as srv, openai_client(srv.url) as client:
            tokenizer = srv.engine.model_info.tokenizer
            together = await client.embeddings.create(model=MODEL, input=TEXTS)  # base64 on the wire
            as_floats = await client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
            alone: dict[int, list[float]] = {}

            async def one(i: int) -> None:
                reply = await client.embeddings.create(model=MODEL, input=TEXTS[i])
                alone[i] = reply.data[0].embedding

            async with trio.open_nursery() as nursery:  # concurrent requests: batched on the MLX thread
                for i in range(len(TEXTS)):
                    nursery.start_soon(one, i)
            ids = [tokenizer.encode(text) for text in TEXTS]
            by_ids = await client.embeddings.create(model=MODEL, input=ids)
            one_ids = await client.embeddings.create(model=MODEL, input=ids[0])
            smaller = await client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=16)
    got = np.array([d.embedding for d in together.data])
    np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(np.array([d.embedding for d in as_floats.data]), want, atol=1e-5)
    np.testing.assert_allclose(np.array([alone[i] for i in range(len(TEXTS))]), want, atol=1e-5)
    np.testing.assert_allclose(np.array([d.embedding for d in by_ids.data]), want, atol=1e-5)
    np.testing.assert_allclose(np.array(one_ids.data[0].embedding), want[0], atol=1e-5)
    np.testing.assert_allclose(np.array(smaller.data[0].embedding), cut[0], atol=1e-5)
    assert [d.index for d in together.data] == [0, 1, 2] and together.model == MODEL
    assert together.usage.prompt_tokens == together.usage.total_tokens == sum(map(len, ids))


async def test_wire_formats_and_mean_pooling(demo_cache_dir):
    want = reference(demo_cache_dir, TEXTS[:2], pooling="mean")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(embed_cfg(demo_cache_dir, "model.pooling=mean")) as srv:
            async with httpx.AsyncClient(base_url=srv.url) as http:
                body = {"model": MODEL, "input": TEXTS[:2]}
                floats = (await http.post("/v1/embeddings", json=body)).json()
                packed = (await http.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
            models = (await httpx.AsyncClient(base_url=srv.url).get("/v1/models")).json()
    assert floats["object"] == "list" and floats["data"][0]["object"] == "embedding"
    vectors = np.array([d["embedding"] for d in floats["data"]])
    np.testing.assert_allclose(vectors, want, atol=1e-5)
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in packed["data"]]
    np.testing.assert_array_equal(np.array(decoded), vectors.astype(np.float32))
    assert models["data"][0]["max_model_len"] == 2048


async def test_bad_requests_get_400s_naming_the_field(demo_cache_dir):
    cfg = embed_cfg(demo_cache_dir, "model.max_model_len=8")
    with trio.fail_after(TIMEOUT_S):
        async with open_server(cfg) as srv, httpx.AsyncClient(base_url=srv.url) as http:
            vocab = srv.engine.model_info.vocab_size
            cases = [
                ({"input": ""}, 400, "input"),
                ({"input": []}, 400, "input"),
                ({"input": [[]]}, 400, "input"),
                ({"input": [1, vocab]}, 400, "input"),
                ({"input": {"a": 1}}, 400, "input"),
                ({"input": ["ok", 3]}, 400, "input"),
                ({"input": "the sea " * 20}, 400, "input"),
                ({"input": "hi", "dimensions": 0}, 400, "dimensions"),
                ({"input": "hi", "dimensions": 65}, 400, "dimensions"),
                ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
                ({"input": "hi", "model": "other"}, 404, "model"),
                ({"input": "hi", "bogus": True}, 400, "bogus"),
            ]
            answers = [await http.post("/v1/embeddings", json={"model": MODEL, **body}) for body, _, _ in cases]
            async with openai_client(srv.url) as client:
                with pytest.raises(openai.BadRequestError, match="embedding model"):
                    await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    for (body, status, param), answer in zip(cases, answers, strict=True):
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["param"] == param, (body, answer.text)
    too_long = answers[6].json()["error"]
    assert too_long["code"] == "context_length_exceeded"
    assert too_long["message"].startswith("This model's maximum context length is 8 tokens. However, you requested")


def test_dimensions_need_a_matryoshka_model():
    plain = EmbeddingInfo(dims=64, pooling="last")
    assert check_dimensions(None, plain, "m") is None and check_dimensions(64, plain, "m") is None
    with pytest.raises(Exception, match='Model "m" does not support matryoshka representation'):
        check_dimensions(16, plain, "m")
    listed = EmbeddingInfo(dims=64, pooling="last", matryoshka=True, matryoshka_dimensions=(16, 32))
    assert check_dimensions(32, listed, "m") == 32
    with pytest.raises(Exception, match=r"only supports \[16, 32\] matryoshka dimensions"):
        check_dimensions(24, listed, "m")


async def test_a_generative_model_refuses_embeddings(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg) as srv, openai_client(srv.url) as client:
            with pytest.raises(openai.BadRequestError, match="does not support the Embeddings API"):
                await client.embeddings.create(model="demo:tiny", input="hi")
