"""The pool's disk tier: blocks written through and spilled, hits read back, budget, clear, restart."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx_trio.core.prefix.block_hash import block_hash
from vllm_mlx_trio.core.prefix.block_pool import BlockPool, Budget
from vllm_mlx_trio.messages import RequestId

A, B = RequestId("a"), RequestId("b")
PROMPT = (1, 2, 3, 4, 5, 6, 7, 8, 9)  # two full blocks of 4, then the last token


def filled(pool: BlockPool, request_id, tokens, nbytes: int = 10) -> None:
    for block in pool.commit(request_id, tokens):
        pool.set_nbytes(block.block_id, nbytes)


def test_new_blocks_are_written_through_and_evicted_ones_spilled():
    pool = BlockPool(4, Budget(max_blocks=1), disk_budget=1000)
    filled(pool, A, PROMPT)
    h0 = block_hash(None, PROMPT[:4])
    h1 = block_hash(h0, PROMPT[4:8])
    assert pool.take_spilled() == ((0, h0), (1, h1))  # written through when created
    pool.release([A])
    assert pool.evict_over_budget() == (1,)
    assert pool.take_spilled() == ((1, h1),)  # the evicted one: kept on disk
    assert pool.num_on_disk == 1 and pool.disk_bytes == 10
    pool.check_invariants()


def test_a_lookup_goes_on_through_spilled_blocks():
    pool = BlockPool(4, Budget(max_blocks=1), disk_budget=1000)
    filled(pool, A, PROMPT)
    pool.release([A])
    pool.evict_over_budget()
    pool.take_spilled()
    hit = pool.lookup(B, PROMPT)
    assert hit.num_cached_tokens == 8 and len(hit.block_ids) == 2
    assert hit.disk_blocks == ((hit.block_ids[1], block_hash(block_hash(None, PROMPT[:4]), PROMPT[4:8])),)
    assert pool.num_on_disk == 0 and pool.block_info(hit.block_ids[1]).nbytes == 10  # in memory again
    pool.check_invariants()


def test_the_disk_budget_forgets_the_least_recently_spilled():
    pool = BlockPool(4, Budget(max_blocks=0), disk_budget=25)
    for n, request_id in enumerate("abc"):
        filled(pool, RequestId(request_id), (10 * n + 1, 10 * n + 2, 10 * n + 3, 10 * n + 4, 0))
        pool.release([RequestId(request_id)])
        pool.evict_over_budget()
        pool.check_invariants()
    assert pool.num_on_disk == 2 and pool.disk_bytes == 20
    assert pool.lookup(A, (1, 2, 3, 4, 0)).num_cached_tokens == 0  # the first was forgotten
    assert pool.lookup(B, (21, 22, 23, 24, 0)).num_cached_tokens == 4


def test_a_restart_remembers_what_the_directory_holds_and_clear_forgets_it():
    pool = BlockPool(4, disk_budget=1000)
    pool.remember_on_disk(block_hash(None, PROMPT[:4]), 10)
    hit = pool.lookup(A, PROMPT)
    assert hit.num_cached_tokens == 4 and hit.disk_blocks == ((hit.block_ids[0], block_hash(None, PROMPT[:4])),)
    pool.release([A])
    pool.remember_on_disk(block_hash(None, (9, 9, 9, 9)), 10)
    pool.clear()
    assert pool.num_on_disk == 0 and pool.lookup(B, (9, 9, 9, 9, 1)).kind == "miss"
    pool.check_invariants()


def test_without_a_disk_tier_nothing_is_spilled_and_hybrid_blocks_never_are():
    pool = BlockPool(4, Budget(max_blocks=0))
    filled(pool, A, PROMPT)
    pool.release([A])
    pool.evict_over_budget()
    assert pool.take_spilled() == () and pool.num_on_disk == 0
    hybrid = BlockPool(4, Budget(max_blocks=0), disk_budget=1000)
    hybrid.commit(A, PROMPT, tail_at=9, blocks_end_hits=False)
    hybrid.release([A])
    hybrid.evict_over_budget()
    assert hybrid.take_spilled() == () and hybrid.num_on_disk == 0


@settings(max_examples=60, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=14), min_size=1, max_size=12),
    max_blocks=st.integers(0, 4),
    disk_budget=st.integers(0, 60),
)
def test_random_traffic_keeps_the_pool_consistent_and_within_the_disk_budget(prompts, max_blocks, disk_budget):
    pool = BlockPool(2, Budget(max_blocks=max_blocks), disk_budget=disk_budget)
    for n, prompt in enumerate(prompts):
        request_id = RequestId(str(n))
        hit = pool.lookup(request_id, tuple(prompt))
        assert {block_id for block_id, _ in hit.disk_blocks} <= set(hit.block_ids)
        filled(pool, request_id, tuple(prompt))
        pool.take_spilled()
        pool.release([request_id])
        pool.evict_over_budget()
        pool.check_invariants()
        assert pool.disk_bytes <= disk_budget
