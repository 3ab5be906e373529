"""The cache manager's block pool is its own: outside the actor it is seen as snapshots only
(``statistics()`` for the gauges, ``blocks()`` for each block), never as the live pool."""

from __future__ import annotations

import trio

from vllm_mlx_trio.actors.prefix.cache_manager import CacheManagerActor
from vllm_mlx_trio.config import CacheConfig
from vllm_mlx_trio.core.prefix.block_pool import DISK_BLOCK_SUFFIX
from vllm_mlx_trio.messages import PrefixCommit, PrefixLookup, PrefixRelease, RequestId

BLOCK = 4


def _actor(**cfg) -> CacheManagerActor:
    _, recv = trio.open_memory_channel(0)
    reply_send, _ = trio.open_memory_channel(0)
    return CacheManagerActor(command_recv=recv, reply_send=reply_send, cfg=CacheConfig(block_size=BLOCK, **cfg))


def test_blocks_are_a_snapshot_of_every_block_and_tail():
    actor = _actor(memory_aware=False)
    rid = RequestId("a")
    tokens = tuple(range(10, 20))  # two full blocks and a tail of two tokens
    actor._handle(PrefixLookup(request_id=rid, prompt_token_ids=tokens))
    actor._handle(PrefixCommit(request_id=rid, token_ids=tokens, block_nbytes=(100, 100), tail_at=10, tail_nbytes=7))
    leased = actor.blocks()
    actor._handle(PrefixRelease(request_ids=(rid,)))
    released = actor.blocks()
    actor.check_invariants()
    assert not hasattr(actor, "pool")  # nothing outside the actor holds the live pool
    full = [b for b in leased if not b.is_tail]
    tails = [b for b in leased if b.is_tail]
    assert [(b.block_index, b.num_tokens, b.nbytes) for b in full] == [(0, BLOCK, 100), (1, BLOCK, 100)]
    assert [(b.num_tokens, b.nbytes) for b in tails] == [(2, 7)]
    assert all(b.ref_count == 1 for b in leased) and all(b.ref_count == 0 for b in released)
    assert [b.block_id for b in released] == [b.block_id for b in leased]  # by id
    assert actor.statistics().pool.num_blocks == len(released) == 3


def test_the_disk_tier_is_counted_in_the_statistics(tmp_path):
    (tmp_path / f"{'ab' * 16}{DISK_BLOCK_SUFFIX}").write_bytes(b"x" * 40)
    on_disk = _actor(memory_aware=False, disk_dir=str(tmp_path)).statistics().pool
    without = _actor(memory_aware=False).statistics().pool
    assert (on_disk.num_on_disk, on_disk.disk_bytes) == (1, 40)
    assert (without.num_on_disk, without.disk_bytes) == (0, 0)
