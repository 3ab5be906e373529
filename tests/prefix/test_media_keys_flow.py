"""Admit.media_keys travel to the cache manager: with the lookup and with the commit."""

from __future__ import annotations

import trio

from vllm_mlx_trio.actors.prefix.cache_client import CacheClient
from vllm_mlx_trio.core.plan import KVReady
from vllm_mlx_trio.messages import PrefixCommit, PrefixLookup, PrefixMatch, PrefixStored
from vllm_mlx_trio.testing.requests import make_request

MEDIA = ((3, "sha-cat"), (40, "sha-dog"))


async def test_the_cache_client_sends_the_requests_media_keys():
    request = make_request(prompt=range(50), max_tokens=4, media_keys=MEDIA, eos_token_ids=(1,))
    assert request.media_keys == MEDIA
    cache_send, cache_recv = trio.open_memory_channel(1)
    reply_send, reply_recv = trio.open_memory_channel(1)
    client = CacheClient(cache_send, reply_recv)
    with trio.fail_after(10):
        reply_send.send_nowait(PrefixMatch(request_id=request.request_id, num_cached_tokens=0, block_ids=()))
        await client.lookup(request)
        lookup = cache_recv.receive_nowait()
        assert isinstance(lookup, PrefixLookup) and lookup.media_keys == MEDIA
        ready = KVReady(
            request_id=request.request_id,
            ready_id=7,
            token_ids=request.prompt_token_ids,
            first_block=0,
            block_nbytes=(),
        )
        reply_send.send_nowait(PrefixStored(request_id=request.request_id, ready_id=7))
        await client.commit(ready, request.cache_keys, request.media_keys)
        commit = cache_recv.receive_nowait()
        assert isinstance(commit, PrefixCommit) and commit.media_keys == MEDIA
