"""KV events in vLLM's wire format, told by the cache manager at its store and evict points."""

from __future__ import annotations

import msgspec
import pytest
import trio
import zmq

from vllm_mlx_trio.actors.prefix.cache_manager import CacheManagerActor
from vllm_mlx_trio.actors.prefix.kv_events import TOPIC, KVEventRecorder, ZmqKVEventPublisher, external_hash
from vllm_mlx_trio.config import CacheConfig
from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.messages import PrefixClear, PrefixCommit, PrefixLookup, PrefixRelease, RequestId
from vllm_mlx_trio.testing.harness import free_port

BLOCK = 4


def _actor(sent: list, **cfg) -> CacheManagerActor:
    send, recv = trio.open_memory_channel(0)
    reply_send, _ = trio.open_memory_channel(0)
    config = CacheConfig(block_size=BLOCK, memory_aware=False, **cfg)
    return CacheManagerActor(
        command_recv=recv, reply_send=reply_send, cfg=config, kv_events=KVEventRecorder(sent.append)
    )


def _run(actor: CacheManagerActor, command) -> object:
    """One command as the actor's loop handles it: answer, then flush the events."""
    reply = actor._handle(command)
    actor._kv_events.flush()
    return reply


def _commit(actor, name: str, tokens: tuple[int, ...]):
    _run(actor, PrefixLookup(request_id=RequestId(name), prompt_token_ids=tokens))
    num_blocks = len(tokens) // BLOCK
    return _run(actor, PrefixCommit(request_id=RequestId(name), token_ids=tokens, block_nbytes=(1,) * num_blocks))


def decode(payload: bytes) -> list:
    """The batch as vllm-router's decoder reads it: plain msgpack arrays, by position."""
    return msgspec.msgpack.decode(payload)


def test_stored_blocks_are_one_batch_in_vllms_array_layout():
    sent: list[bytes] = []
    actor = _actor(sent)
    tokens = tuple(range(10, 20))  # two full blocks and a partial one
    _commit(actor, "a", tokens)
    assert len(sent) == 1
    ts, events, rank = decode(sent[0])
    assert isinstance(ts, float) and rank is None
    first, second = events
    full = sorted((b for b in actor.blocks() if not b.is_tail), key=lambda b: b.block_index)
    hashes = [external_hash(b.block_hash) for b in full]
    assert first == ["BlockStored", [hashes[0]], None, [10, 11, 12, 13], BLOCK, None, "GPU", None]
    assert second == ["BlockStored", [hashes[1]], hashes[0], [14, 15, 16, 17], BLOCK, None, "GPU", None]
    assert all(0 <= h < 2**64 for h in hashes)


def test_a_shared_prefix_is_not_stored_twice_and_evictions_name_the_stored_hashes():
    sent: list[bytes] = []
    actor = _actor(sent, max_entries=2)
    _commit(actor, "a", (1, 2, 3, 4, 5, 6, 7, 8))
    _commit(actor, "b", (1, 2, 3, 4, 9, 9, 9, 9))  # block 0 shared: only block 1 is new
    stored_b = decode(sent[1])[1]
    assert [e[0] for e in stored_b] == ["BlockStored"] and stored_b[0][3] == [9, 9, 9, 9]
    _run(actor, PrefixRelease(request_ids=(RequestId("a"), RequestId("b"))))  # 3 blocks > budget 2
    removed = decode(sent[-1])[1]
    assert removed[0][0] == "BlockRemoved" and removed[0][2] == "GPU"
    stored_hashes = {e[1][0] for batch in sent[:2] for e in decode(batch)[1]}
    assert set(removed[0][1]) <= stored_hashes and len(removed[0][1]) == 1
    _run(actor, PrefixClear())
    cleared = decode(sent[-1])[1]
    assert cleared[0][0] == "BlockRemoved" and len(cleared[0][1]) == 2


def test_nothing_is_sent_for_a_lookup_or_a_commit_of_cached_blocks():
    sent: list[bytes] = []
    actor = _actor(sent)
    _commit(actor, "a", (1, 2, 3, 4))
    _commit(actor, "b", (1, 2, 3, 4))
    assert len(sent) == 1


async def test_batches_reach_a_zmq_subscriber_as_vllm_frames():
    port = free_port()
    publisher = ZmqKVEventPublisher(f"tcp://*:{port}")
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")  # vllm-router's topic filter
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(sub, zmq.POLLIN)
    try:
        with trio.fail_after(20):
            # A PUB drops what it sends before the subscription reaches it (ZMQ's slow joiner):
            # publish until one batch arrives; the poll between tries waits on ZMQ's own thread.
            while True:
                publisher._hashes[7] = 77  # as if block 7 had been stored
                publisher.removed([7])
                publisher.flush()
                if poller.poll(timeout=50):
                    break
                await trio.lowlevel.checkpoint()
        topic, seq, payload = sub.recv_multipart()
    finally:
        sub.close(linger=0)
        publisher.close()
    assert topic == TOPIC and len(seq) == 8
    assert decode(payload)[1] == [["BlockRemoved", [77], "GPU"]]


def test_an_endpoint_that_cannot_bind_is_a_config_error():
    port = free_port()
    first = ZmqKVEventPublisher(f"tcp://*:{port}")
    try:
        with pytest.raises(ConfigError, match="cache.kv_events_endpoint"):
            ZmqKVEventPublisher(f"tcp://*:{port}")
    finally:
        first.close()
