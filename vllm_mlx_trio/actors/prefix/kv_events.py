"""The prefix cache's block events in vLLM's KV-event wire format, for vllm-router's ``kv_aware``.

vLLM publishes ``[topic, seq (8 bytes, big-endian), msgpack KVEventBatch]`` on a ZMQ PUB
socket; the batch and its events are msgspec Structs encoded ``array_like`` with the class name
as tag: ``[ts, [event...], data_parallel_rank]``, ``["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name]``, ``["BlockRemoved",
block_hashes, medium]``, ``["AllBlocksCleared"]`` (vllm-router's decoder reads exactly these
positions). One batch is published per cache command that stored or evicted blocks.

Hashes: our block hashes are chained SHA-256 over token ids and extra keys
(``core/prefix/block_hash.py``); an event carries the first 8 bytes of it as an unsigned 64-bit int,
so a ``BlockRemoved`` names the same block its ``BlockStored`` did. vllm-router does not use
these values to match prompts: it tokenizes the request text itself and hashes the token ids
with its own function, so it matches on the ``token_ids`` each ``BlockStored`` carries (and
``block_size``, which must equal its ``--kv-event-block-size``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from ...core.prefix.block_pool import BlockPool
from ...errors import ConfigError
from ...messages import BlockId

logger = logging.getLogger(__name__)

#: The topic every batch goes out under. vLLM's default topic is "" (a subscriber to "" takes
#: any); vllm-router's event pool subscribes to the prefix "kv@", which this satisfies.
TOPIC = b"kv@vllm-mlx-trio"
#: Batches the PUB socket queues for a slow subscriber before dropping (ZMQ's high-water mark);
#: vLLM's default. Publishing never blocks the cache manager.
SEND_HIGH_WATER_MARK = 100_000
#: The medium vLLM names for blocks in accelerator memory.
MEDIUM = "GPU"


class BlockStored(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(msgspec.Struct, array_like=True, tag=True):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(msgspec.Struct, array_like=True, tag=True):
    pass


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


def external_hash(block_hash: bytes) -> int:
    """A block's hash as events carry it: its first 8 bytes, an unsigned 64-bit int."""
    return int.from_bytes(block_hash[:8], "big")


class KVEventSink(Protocol):
    """What the cache manager tells about its blocks (a no-op when events are off)."""

    def stored(
        self,
        pool: BlockPool,
        token_ids: Sequence[int],
        extra_keys: Any,
        block_ids: Sequence[BlockId],
        media_keys: Sequence[tuple[int, str]] = (),
    ) -> None: ...

    def removed(self, block_ids: Sequence[BlockId]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class NoKVEvents:
    """``cache.kv_events_endpoint`` not set: nothing is recorded or sent."""

    def stored(
        self,
        pool: BlockPool,
        token_ids: Sequence[int],
        extra_keys: Any,
        block_ids: Sequence[BlockId],
        media_keys: Sequence[tuple[int, str]] = (),
    ) -> None:
        pass

    def removed(self, block_ids: Sequence[BlockId]) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class KVEventRecorder:
    """Turns the cache manager's stores and evictions into events, one batch per ``flush``.

    Remembers each published block's external hash until it is removed: an evicted block is
    already gone from the pool when its removal is told.
    """

    def __init__(self, send: Any):
        self._send = send  # (payload bytes) -> None
        self._hashes: dict[BlockId, int] = {}
        self._events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        self._encoder = msgspec.msgpack.Encoder()

    def stored(
        self,
        pool: BlockPool,
        token_ids: Sequence[int],
        extra_keys: Any,
        block_ids: Sequence[BlockId],
        media_keys: Sequence[tuple[int, str]] = (),
    ) -> None:
        size = pool.block_size
        for block_id in block_ids:
            info = pool.block_info(block_id)
            start = info.block_index * size
            parent = None
            if info.block_index > 0:  # the block before it in this prompt's chain
                chain = pool.cached_prefix(token_ids[:start], extra_keys, tuple(media_keys))
                if len(chain) == info.block_index:
                    parent = external_hash(pool.block_info(chain[-1]).block_hash)
            self._hashes[block_id] = external_hash(info.block_hash)
            self._events.append(
                BlockStored(
                    block_hashes=[self._hashes[block_id]],
                    parent_block_hash=parent,
                    token_ids=list(token_ids[start : start + size]),
                    block_size=size,
                    lora_id=None,
                    medium=MEDIUM,
                    lora_name=None,
                )
            )

    def removed(self, block_ids: Sequence[BlockId]) -> None:
        hashes = [h for h in (self._hashes.pop(b, None) for b in block_ids) if h is not None]
        if hashes:
            self._events.append(BlockRemoved(block_hashes=hashes, medium=MEDIUM))

    def flush(self) -> None:
        """Send what was recorded since the last flush, as one batch (nothing: no send)."""
        if not self._events:
            return
        batch = KVEventBatch(ts=time.time(), events=self._events)
        self._events = []
        self._send(self._encoder.encode(batch))

    def close(self) -> None:
        pass


class ZmqKVEventPublisher(KVEventRecorder):
    """A :class:`KVEventRecorder` that publishes on a ZMQ PUB socket, never blocking: a batch a
    slow subscriber has no room for is dropped by ZMQ (vLLM's publisher behaves the same)."""

    def __init__(self, endpoint: str):
        import zmq  # noqa: PLC0415 (an optional dependency: only a server that publishes needs it)

        self._zmq = zmq
        self._socket = zmq.Context.instance().socket(zmq.PUB)
        self._socket.set_hwm(SEND_HIGH_WATER_MARK)
        self._socket.setsockopt(zmq.LINGER, 0)
        # vLLM's rule: bind a wildcard or local endpoint, connect to a named host.
        try:
            if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
                self._socket.bind(endpoint)
            else:
                self._socket.connect(endpoint)
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            raise ConfigError(f"cache.kv_events_endpoint {endpoint!r}: {exc}") from None
        self._seq = 0
        super().__init__(self._publish)
        logger.info("publishing KV events on %s", endpoint)

    def _publish(self, payload: bytes) -> None:
        frames = (TOPIC, self._seq.to_bytes(8, "big"), payload)
        self._seq += 1
        try:
            self._socket.send_multipart(frames, flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            logger.debug("KV event batch dropped: no subscriber room")

    def close(self) -> None:
        self._socket.close(linger=0)


def kv_event_sink(endpoint: str | None) -> KVEventSink:
    """The publisher ``cache.kv_events_endpoint`` asks for."""
    return NoKVEvents() if endpoint is None else ZmqKVEventPublisher(endpoint)
