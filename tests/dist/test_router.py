"""Two replicas behind vllm-router on loopback: the router's bodies are accepted, cache_aware
keeps a shared prefix on one replica, and a killed replica's traffic moves to the other."""

from __future__ import annotations

import contextlib
import importlib.util

import httpx
import openai
import pytest
import trio
from replicas import REPO, ROUTER, replica, router

pytestmark = [
    pytest.mark.mlx,
    pytest.mark.skipif(not ROUTER.exists(), reason="vllm-router is not installed (the test extra has it)"),
]
MODEL = "demo:tiny"
SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12
HITS = "vllm:prefix_cache_hits_total"


@contextlib.asynccontextmanager
async def two_replicas_behind_router(tmp_path, demo_cache_dir, policy, *flags):
    async with (
        replica(tmp_path, demo_cache_dir) as a,
        replica(tmp_path, demo_cache_dir) as b,
        router(tmp_path, [a.url, b.url], policy, *flags) as front,
    ):
        yield a, b, front


def ask(client: openai.AsyncOpenAI, question: str, **kwargs):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, **kwargs)


async def test_plain_and_streaming_chat_through_the_router_and_cache_aware_placement(tmp_path, demo_cache_dir):
    with trio.fail_after(240):
        async with (
            two_replicas_behind_router(tmp_path, demo_cache_dir, "cache_aware") as (a, b, front),
            httpx.AsyncClient(timeout=10) as http,
        ):
            client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0)
            plain = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0
            )
            assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 4
            stream = await client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=4, temperature=0, stream=True
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].choices[0].finish_reason == "length"
            assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content

            before = [await r.metric(http, HITS) for r in (a, b)]
            for i in range(10):
                await ask(client, f"question {i}")
            gained = [await r.metric(http, HITS) - was for r, was in zip((a, b), before, strict=True)]
    # every repeat lands where the prefix is: one replica's hits rise, the other's stay put
    assert sorted(gained)[0] == 0 and sorted(gained)[1] >= 9 * 16, gained


async def test_a_killed_replica_s_requests_are_retried_on_the_other(tmp_path, demo_cache_dir):
    flags = ("--cb-failure-threshold", "1", "--retry-max-retries", "3", "--retry-initial-backoff-ms", "10")
    with trio.fail_after(240):
        async with two_replicas_behind_router(tmp_path, demo_cache_dir, "cache_aware", *flags) as (a, b, front):
            client = openai.AsyncOpenAI(base_url=f"{front.url}/v1", api_key="none", max_retries=0)
            await ask(client, "warm up")
            async with httpx.AsyncClient(timeout=10) as http:
                holder = a if await a.metric(http, "vllm:prefix_cache_queries_total") else b
            holder.proc.kill()
            await holder.proc.wait()
            answers = [await ask(client, f"question {i}") for i in range(4)]
            stream = await ask(client, "streamed", stream=True)
            chunks = [chunk async for chunk in stream]
    assert all(answer.choices[0].finish_reason == "length" for answer in answers)
    assert chunks[-1].choices[0].finish_reason == "length"


async def test_router_example_runs(demo_cache_dir):
    spec = importlib.util.spec_from_file_location("router_replicas", REPO / "examples" / "router_replicas.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    with trio.fail_after(240):
        result = await trio.to_thread.run_sync(example.main, f"model.demo_cache_dir={demo_cache_dir}")
    assert result["plain"] and result["streamed"]
    assert sorted(result["hits"])[0] == 0 and sorted(result["hits"])[1] > 0
