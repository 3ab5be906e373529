"""GET /v1/cache/stats and DELETE /v1/cache: their shape on the fake executor, and hits,
``cached_tokens`` and clearing on the real demo model."""

from __future__ import annotations

import attrs
import httpx
import pytest
import trio

from vllm_mlx_trio.testing.harness import fake_server, open_server
from vllm_mlx_trio.testing.requests import post_chat

MODEL = "demo:tiny"
TIMEOUT_S = 120
#: Several 64-token blocks with the demo tokenizer.
SYSTEM = (
    "You are a patient assistant for a small public library. Keep every answer short, say so "
    "when you do not know, never invent titles or authors, and point readers to the catalogue "
    "desk for anything about loans, fines or opening hours. Prefer plain words to jargon. "
) * 2
LONG_CHAT = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Any good books on rivers?"}]


async def ask(http: httpx.AsyncClient, url: str, messages=LONG_CHAT) -> dict:
    """A short greedy answer to ``messages`` (the long library chat by default)."""
    return await post_chat(http, url, messages=messages, max_tokens=4, temperature=0)


async def stats(http: httpx.AsyncClient, url: str) -> dict:
    resp = await http.get(f"{url}/v1/cache/stats")
    assert resp.status_code == 200, resp.text
    return resp.json()


async def test_stats_shape_on_a_fresh_server(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg, "Hello!") as srv, httpx.AsyncClient() as http:
            body = await stats(http, srv.url)
    assert list(body) == [
        "enabled",
        "block_size",
        "queries",
        "hits",
        "prefix_hits",
        "misses",
        "hit_rate",
        "tokens_saved",
        "evictions",
        "blocks",
        "memory",
    ]
    assert body["enabled"] is True and body["block_size"] == fake_cfg.cache.block_size == 64
    counters = ("queries", "hits", "prefix_hits", "misses", "tokens_saved", "evictions")
    assert all(body[name] == 0 for name in counters) and body["hit_rate"] == 0.0
    assert body["blocks"] == {"total": 0, "in_use": 0, "shared": 0, "free": 0}
    memory = body["memory"]
    assert list(memory) == ["bytes_used", "bytes_limit", "max_blocks", "over_budget"]
    assert memory["bytes_used"] == 0 and memory["over_budget"] is False
    assert memory["bytes_limit"] > 0 and memory["max_blocks"] is None  # memory-aware by default


async def test_stats_count_lookups_and_legacy_budget_is_blocks(fake_cfg):
    cfg = attrs.evolve(fake_cfg, cache=attrs.evolve(fake_cfg.cache, memory_aware=False, max_entries=7))
    with trio.fail_after(20):
        async with fake_server(cfg, "Hello!") as srv, httpx.AsyncClient() as http:
            await ask(http, srv.url)
            body = await stats(http, srv.url)
    # The fake executor computes no KV, so nothing is cached: every lookup is a miss.
    assert (body["queries"], body["misses"], body["hits"], body["hit_rate"]) == (1, 1, 0, 0.0)
    assert body["memory"]["bytes_limit"] is None and body["memory"]["max_blocks"] == 7


async def test_delete_on_an_empty_cache_and_wrong_methods(fake_cfg):
    with trio.fail_after(20):
        async with fake_server(fake_cfg, "Hello!") as srv, httpx.AsyncClient() as http:
            cleared = await http.delete(f"{srv.url}/v1/cache")
            post = await http.post(f"{srv.url}/v1/cache/stats")
            get = await http.get(f"{srv.url}/v1/cache")
    assert cleared.status_code == 200 and cleared.json() == {"dropped_blocks": 0}
    for resp in (post, get):
        assert resp.status_code == 405
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "method_not_allowed"
        assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.mlx
async def test_repeated_prompt_hits_and_delete_makes_it_miss(demo_cfg):
    with trio.fail_after(TIMEOUT_S):
        async with open_server(demo_cfg) as srv, httpx.AsyncClient(timeout=60) as http:
            first = await ask(http, srv.url)
            second = await ask(http, srv.url)
            hit = await stats(http, srv.url)
            cleared = await http.delete(f"{srv.url}/v1/cache")
            emptied = await stats(http, srv.url)
            third = await ask(http, srv.url)
            missed = await stats(http, srv.url)
    block = demo_cfg.cache.block_size
    prompt_tokens = first["usage"]["prompt_tokens"]
    assert prompt_tokens > 2 * block
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == prompt_tokens - 1  # an exact repeat reuses all but its last token
    assert second["choices"][0]["message"] == first["choices"][0]["message"]  # greedy, same tokens
    assert (hit["queries"], hit["hits"], hit["misses"], hit["hit_rate"]) == (2, 1, 1, 0.5)
    assert hit["tokens_saved"] == cached
    assert hit["blocks"]["total"] >= prompt_tokens // block and hit["memory"]["bytes_used"] > 0
    assert cleared.status_code == 200
    assert cleared.json() == {"dropped_blocks": hit["blocks"]["total"]}
    assert emptied["blocks"]["total"] == 0 and emptied["memory"]["bytes_used"] == 0
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert third["choices"][0]["message"] == first["choices"][0]["message"]
    assert (missed["queries"], missed["hits"], missed["misses"]) == (3, 1, 2)
