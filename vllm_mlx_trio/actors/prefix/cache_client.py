"""The scheduler's side of the cache-manager edge: one request, one reply, in order.

The scheduler owns (and closes) both channel ends; this class only pairs each command with
its reply, so the scheduler's code reads as plain calls.
"""

from __future__ import annotations

import trio

from ...core.request import Request
from ...messages import (
    BlockId,
    CacheCommand,
    CacheReply,
    KVReady,
    PrefixClear,
    PrefixCleared,
    PrefixCommit,
    PrefixLookup,
    PrefixMatch,
    PrefixRelease,
    PrefixReleased,
    PrefixStored,
    RequestId,
)


class CacheClient:
    """Round trips to the :class:`~vllm_mlx_trio.actors.prefix.cache_manager.CacheManagerActor`."""

    def __init__(
        self,
        cache_send: trio.MemorySendChannel[CacheCommand],
        match_recv: trio.MemoryReceiveChannel[CacheReply],
    ):
        self._send = cache_send
        self._recv = match_recv

    async def lookup(self, request: Request) -> PrefixMatch:
        """Lease the longest cached prefix of everything the request holds (prompt + output)."""
        await self._send.send(
            PrefixLookup(
                request_id=request.request_id,
                prompt_token_ids=request.all_token_ids,
                extra_keys=request.cache_keys,
                media_keys=request.media_keys,
            )
        )
        match = await self._recv.receive()
        assert isinstance(match, PrefixMatch) and match.request_id == request.request_id
        return match

    async def commit(
        self, ready: KVReady, extra_keys: tuple, media_keys: tuple[tuple[int, str], ...] = ()
    ) -> PrefixStored:
        """Offer a computed prompt's new blocks; the reply says which copies to keep."""
        await self._send.send(
            PrefixCommit(
                request_id=ready.request_id,
                token_ids=ready.token_ids,
                extra_keys=extra_keys,
                media_keys=media_keys,
                ready_id=ready.ready_id,
                first_block=ready.first_block,
                block_nbytes=ready.block_nbytes,
                tail_at=ready.tail_at,
                tail_nbytes=ready.tail_nbytes,
                blocks_end_hits=ready.blocks_end_hits,
                boundary_at=ready.boundary_at,
                boundary_nbytes=ready.boundary_nbytes,
            )
        )
        stored = await self._recv.receive()
        assert isinstance(stored, PrefixStored) and stored.ready_id == ready.ready_id
        return stored

    async def release(self, request_ids: tuple[RequestId, ...]) -> PrefixReleased:
        """Return these requests' leases; the blocks evicted to stay in budget (and which of
        them to spill to disk) come back."""
        await self._send.send(PrefixRelease(request_ids=request_ids))
        released = await self._recv.receive()
        assert isinstance(released, PrefixReleased)
        return released

    async def clear(self) -> tuple[BlockId, ...]:
        """Drop every unleased block; the dropped ids come back."""
        await self._send.send(PrefixClear())
        cleared = await self._recv.receive()
        assert isinstance(cleared, PrefixCleared)
        return cleared.evicted
