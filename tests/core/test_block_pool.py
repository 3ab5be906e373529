"""The prefix cache's bookkeeping alone: exact ids, ref counts and queue order; a model check."""

from __future__ import annotations

import collections

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from vllm_mlx_trio.core.prefix.block_hash import block_hash
from vllm_mlx_trio.core.prefix.block_pool import TAIL_INDEX, BlockPool, Budget, NewBlock
from vllm_mlx_trio.core.prefix.child_index import common_length
from vllm_mlx_trio.messages import BlockId, RequestId

A, B, C = RequestId("a"), RequestId("b"), RequestId("c")
SYSTEM = (1, 2, 3, 4, 5, 6, 7, 8)  # two blocks of 4


def new_ids(blocks: tuple[NewBlock, ...]) -> list[int]:
    return [b.block_id for b in blocks]


def refs(pool: BlockPool) -> dict[int, int]:
    """Ref count of every cached block, by id."""
    return {b: pool.ref_count(b) for b in range(pool.next_id) if b in pool}


# -- the hash -------------------------------------------------------------------------------


def test_block_hash_is_stable_and_sensitive_to_every_input():
    h0 = block_hash(None, (1, 2, 3, 4))
    assert h0.hex() == "61e86bdef68b53aef6936b99cbee5f49"  # stable across processes
    assert block_hash(h0, (5, 6, 7, 8), ("salt",)).hex() == "b7dcf6b615444007f4dabdd6282794f7"
    assert len(h0) == 16
    distinct = {
        h0,
        block_hash(None, (1, 2, 3, 5)),
        block_hash(h0, (1, 2, 3, 4)),
        block_hash(None, (1, 2, 3, 4), ("salt",)),
        block_hash(None, (1, 2, 3, 4), (1,)),
        block_hash(None, (1, 2, 3, 4), (True,)),
        block_hash(None, (1, 2, 3, 4), ("1",)),
        block_hash(None, (1, 2, 3, 4), (b"1",)),
        block_hash(None, (1, 2, 3, 4), (("1",),)),
        block_hash(None, (1, 2, 3, 4), ("a", "b")),
        block_hash(None, (1, 2, 3, 4), ("ab",)),
        block_hash(None, (12, 3, 4)),
    }
    assert len(distinct) == 12


def test_block_hash_rejects_keys_without_canonical_bytes():
    with pytest.raises(TypeError):
        block_hash(None, (1,), ([1],))
    with pytest.raises(TypeError):
        block_hash(None, (1,), (1.5,))


# -- scripted sequences -----------------------------------------------------------------------


def test_two_requests_share_a_system_prompt():
    pool = BlockPool(4)
    prompt_a = SYSTEM + (100, 101, 102)
    prompt_b = SYSTEM + (200, 201, 202, 203, 204)

    assert pool.lookup(A, prompt_a).kind == "miss"
    created = pool.commit(A, prompt_a)
    assert created == (
        NewBlock(block_id=0, block_index=0, token_start=0, token_end=4),
        NewBlock(block_id=1, block_index=1, token_start=4, token_end=8),
    )
    hit = pool.lookup(B, prompt_b)
    assert (hit.block_ids, hit.num_cached_tokens, hit.kind) == ((0, 1), 8, "prefix_hit")
    assert refs(pool) == {0: 2, 1: 2}
    assert new_ids(pool.commit(B, prompt_b)) == [2]  # the shared blocks are not leased twice
    assert refs(pool) == {0: 2, 1: 2, 2: 1}
    assert pool.holders(B) == (0, 1, 2)
    stats = pool.stats()
    assert (stats.num_blocks, stats.num_in_use, stats.num_shared, stats.num_free) == (3, 3, 2, 0)

    pool.release([A])
    assert refs(pool) == {0: 1, 1: 1, 2: 1}
    assert pool.free_queue() == ()
    pool.release([B])
    assert refs(pool) == {0: 0, 1: 0, 2: 0}
    assert pool.free_queue() == (2, 1, 0)  # tail first
    pool.check_invariants()


def test_release_is_once_per_request_and_ignores_unknown_ones():
    pool = BlockPool(4)
    pool.commit(A, SYSTEM)
    pool.lookup(B, SYSTEM + (9,))
    assert refs(pool) == {0: 2, 1: 2}
    pool.release([A])
    pool.release([A, RequestId("nobody")])
    assert refs(pool) == {0: 1, 1: 1}
    pool.release([B, B])
    assert refs(pool) == {0: 0, 1: 0}
    pool.check_invariants()


def test_tail_blocks_are_evicted_before_head_blocks_and_leased_ones_never():
    pool = BlockPool(4, Budget(max_blocks=1))
    assert new_ids(pool.commit(A, SYSTEM + (9, 10, 11, 12))) == [0, 1, 2]
    assert pool.evict_over_budget() == ()  # all leased: over budget is allowed
    assert pool.stats().over_budget
    pool.release([A])
    assert pool.free_queue() == (2, 1, 0)
    assert pool.evict_over_budget() == (2, 1)
    assert pool.free_queue() == (0,)
    stats = pool.stats()
    assert (stats.num_blocks, stats.num_evictions, stats.over_budget) == (1, 2, False)
    pool.check_invariants()


def test_blocks_freed_together_queue_deepest_first_across_requests():
    pool = BlockPool(2)
    pool.commit(A, (1, 1, 2, 2, 3, 3))  # ids 0, 1, 2
    pool.commit(B, (4, 4, 5, 5))  # ids 3, 4
    pool.release([A, B])
    assert pool.free_queue() == (2, 1, 4, 0, 3)


def test_eviction_is_least_recently_used_across_requests():
    pool = BlockPool(4, Budget(max_blocks=2))
    prompt_a = SYSTEM + (9,)
    prompt_b = (11, 12, 13, 14, 15, 16, 17, 18, 19)
    assert new_ids(pool.commit(A, prompt_a)) == [0, 1]
    pool.release([A])
    assert new_ids(pool.commit(B, prompt_b)) == [2, 3]
    pool.release([B])
    assert pool.free_queue() == (1, 0, 3, 2)
    hit = pool.lookup(C, prompt_a)  # A's blocks are used again ...
    assert (hit.block_ids, hit.kind) == ((0, 1), "hit")
    assert pool.free_queue() == (3, 2)
    pool.release([C])
    assert pool.free_queue() == (3, 2, 1, 0)
    assert pool.evict_over_budget() == (3, 2)  # ... so B's go first
    assert pool.lookup(C, prompt_b).kind == "miss"
    assert pool.lookup(C, prompt_a).kind == "hit"
    pool.check_invariants()


def test_a_leased_block_survives_eviction():
    pool = BlockPool(4, Budget(max_blocks=0))
    pool.commit(A, SYSTEM)
    pool.commit(B, (9, 9, 9, 9))
    pool.release([B])
    assert pool.evict_over_budget() == (2,)
    assert refs(pool) == {0: 1, 1: 1}
    assert pool.stats().over_budget
    pool.release([A])
    assert pool.evict_over_budget() == (1, 0)
    assert pool.stats().num_blocks == 0 and not pool.stats().over_budget
    pool.check_invariants()


def test_clear_drops_only_unreferenced_blocks():
    pool = BlockPool(4)
    pool.commit(A, SYSTEM)
    pool.commit(B, (9, 9, 9, 9, 9))
    pool.release([B])
    assert pool.clear() == (2,)
    assert refs(pool) == {0: 1, 1: 1}
    assert pool.lookup(C, (9, 9, 9, 9, 9)).kind == "miss"
    assert pool.lookup(C, SYSTEM + (0,)).block_ids == (0, 1)
    pool.check_invariants()


def test_block_ids_are_never_reused():
    pool = BlockPool(4)
    pool.commit(A, SYSTEM)
    pool.release([A])
    assert pool.clear() == (1, 0)
    assert new_ids(pool.commit(B, SYSTEM)) == [2, 3]
    with pytest.raises(KeyError):
        pool.ref_count(0)


def test_commit_twice_prompt_then_output_leases_once():
    pool = BlockPool(4)
    prompt = SYSTEM + (9, 10)
    assert pool.lookup(A, prompt).kind == "miss"
    assert new_ids(pool.commit(A, prompt)) == [0, 1]
    created = pool.commit(A, prompt + (11, 12, 13, 14, 15))  # prompt + output
    assert created == (NewBlock(block_id=2, block_index=2, token_start=8, token_end=12),)
    assert refs(pool) == {0: 1, 1: 1, 2: 1}
    assert pool.holders(A) == (0, 1, 2)
    pool.check_invariants()


def test_lookup_then_commit_by_the_same_request_leases_once():
    pool = BlockPool(4)
    pool.commit(A, SYSTEM)
    pool.lookup(B, SYSTEM + (9,))
    assert new_ids(pool.commit(B, SYSTEM + (9, 10, 11, 12))) == [2]
    assert refs(pool) == {0: 2, 1: 2, 2: 1}
    pool.check_invariants()


def test_two_requests_computing_the_same_prompt_share_the_first_commit():
    pool = BlockPool(4)
    assert pool.lookup(A, SYSTEM + (9,)).kind == "miss"
    assert pool.lookup(B, SYSTEM + (9,)).kind == "miss"
    assert new_ids(pool.commit(A, SYSTEM)) == [0, 1]
    assert pool.commit(B, SYSTEM) == ()  # B's duplicate KV is not stored
    assert refs(pool) == {0: 2, 1: 2}


# -- classification ------------------------------------------------------------------------

CACHED = SYSTEM  # two full blocks of 4 committed


@pytest.mark.parametrize(
    ("prompt", "block_ids", "num_cached", "kind"),
    [
        ((), (), 0, "miss"),
        ((1, 2, 3), (0,), 2, "hit"),  # shorter than a block: a part of block 0
        ((1, 2, 3, 4), (0,), 3, "hit"),  # one exact block: its last token is recomputed
        ((1, 2, 3, 4, 5), (0,), 4, "hit"),
        (SYSTEM, (0, 1), 7, "hit"),  # exact repeat: all but the last token
        (SYSTEM + (9,), (0, 1), 8, "hit"),
        (SYSTEM + (9, 9, 9, 9), (0, 1), 8, "hit"),  # every eligible block matched
        (SYSTEM + (9, 9, 9, 9, 9), (0, 1), 8, "prefix_hit"),
        ((1, 2, 3, 4, 5, 6, 7, 0, 9), (0, 1), 7, "prefix_hit"),  # diverges inside the second block
        ((1, 2, 3, 0, 5, 6, 7, 8, 9), (0,), 3, "prefix_hit"),  # diverges inside the first block
        ((0, 2, 3, 4, 5, 6, 7, 8, 9), (), 0, "miss"),
    ],
)
def test_hit_kind(prompt, block_ids, num_cached, kind):
    """All-KV blocks: a hit ends anywhere, even inside a block (its KV prefix is exact)."""
    pool = BlockPool(4)
    pool.commit(A, CACHED)
    hit = pool.lookup(B, prompt)
    assert (hit.block_ids, hit.num_cached_tokens, hit.kind) == (block_ids, num_cached, kind)
    assert hit.num_cached_tokens <= max(0, len(prompt) - 1)
    stats = pool.stats()
    assert (stats.num_hits, stats.num_prefix_hits, stats.num_misses) == (
        int(kind == "hit"),
        int(kind == "prefix_hit"),
        int(kind == "miss"),
    )
    assert stats.tokens_saved == hit.num_cached_tokens
    assert refs(pool) == {0: 1 + (0 in block_ids), 1: 1 + (1 in block_ids)}


def test_a_tail_gives_an_exact_repeat_all_but_its_last_token():
    """A 6-token prompt (one block + 2) commits its checkpoint at 5 tokens: a repeat hits 5."""
    pool = BlockPool(4)
    prompt = (1, 2, 3, 4, 5, 6)
    created = pool.commit(A, prompt[:5], tail_at=5)
    assert created == (
        NewBlock(block_id=0, block_index=0, token_start=0, token_end=4),
        NewBlock(block_id=1, block_index=TAIL_INDEX, token_start=4, token_end=5),
    )
    assert created[1].is_tail and pool.is_tail(1) and not pool.is_tail(0)
    hit = pool.lookup(B, prompt)
    assert (hit.block_ids, hit.num_cached_tokens, hit.kind) == ((0, 1), 5, "hit")
    assert pool.commit(B, prompt[:5], tail_at=5) == ()  # the same tail is shared, not made again
    assert pool.stats().num_tails == 1
    pool.release([A, B])
    assert pool.free_queue() == (1, 0)  # the tail goes before the block at its depth
    pool.check_invariants()


def test_blocks_of_a_model_with_state_layers_end_a_hit_only_at_a_checkpoint():
    """blocks_end_hits=False (sliding-window or recurrent layers): no hit inside or right after
    a bare block; an empty tail marks a checkpoint at a block boundary."""
    pool = BlockPool(4)
    pool.commit(A, SYSTEM + (9,), tail_at=9, blocks_end_hits=False)
    assert pool.lookup(B, SYSTEM + (7, 7)).num_cached_tokens == 0  # blocks alone end nothing
    hit = pool.lookup(B, SYSTEM + (9, 9))
    assert (hit.block_ids, hit.num_cached_tokens) == ((0, 1, 2), 9)
    assert pool.lookup(C, SYSTEM + (9,)).num_cached_tokens == 0  # the checkpoint is at its last token
    created = pool.commit(C, SYSTEM, tail_at=8, blocks_end_hits=False)
    assert [(b.block_index, b.token_start, b.token_end) for b in created] == [(TAIL_INDEX, 8, 8)]
    hit = pool.lookup(RequestId("d"), SYSTEM + (5, 5))
    assert (hit.block_ids, hit.num_cached_tokens) == ((0, 1, created[0].block_id), 8)
    pool.check_invariants()


def test_evicting_a_block_takes_its_tails_along():
    pool = BlockPool(4, Budget(max_blocks=1))
    pool.commit(A, (1, 2, 3, 4, 5, 6), tail_at=5)  # block 0, tail 1
    pool.commit(B, (7, 7, 7, 7, 7), tail_at=5)  # block 2, tail 3
    pool.release([A])
    pool.release([B])
    assert pool.free_queue() == (1, 0, 3, 2)
    assert pool.evict_over_budget() == (1, 0, 3)
    assert pool.lookup(C, (7, 7, 7, 7, 7, 7)).num_cached_tokens == 4
    pool.release([C])
    assert pool.clear() == (2,)
    pool.commit(A, (1, 2, 3, 4, 5, 6), tail_at=5)
    pool.release([A])
    assert pool.free_queue() == (5, 4)
    assert pool.clear() == (5, 4)
    pool.commit(A, (1, 2, 3, 4, 5, 6), tail_at=5)
    pool.release([A])
    assert sorted(pool._drop(BlockId(6))) == [6, 7]  # a block's drop cascades to its tail
    pool.check_invariants()


def test_salt_and_extra_keys_isolate_the_whole_chain():
    pool = BlockPool(4)
    prompt = SYSTEM + (9,)
    assert new_ids(pool.commit(A, prompt, ("salt-a",))) == [0, 1]
    assert pool.lookup(B, prompt).kind == "miss"
    assert pool.lookup(B, prompt, ("salt-b",)).kind == "miss"
    assert pool.lookup(B, prompt, ("salt-a",)).block_ids == (0, 1)
    assert new_ids(pool.commit(C, prompt, ("salt-b",))) == [2, 3]  # no block is shared
    assert new_ids(pool.commit(C, prompt, (b"image-hash", "salt-b"))) == [4, 5]
    assert pool.cached_prefix(prompt) == ()
    pool.check_invariants()


# -- budgets ---------------------------------------------------------------------------------


def test_memory_budget_counts_reported_bytes():
    pool = BlockPool(4, Budget(max_bytes=100))
    assert new_ids(pool.commit(A, SYSTEM + (9, 9, 9, 9))) == [0, 1, 2]
    pool.commit(B, (7, 7, 7, 7))  # id 3: its size is never reported, so it counts 0 bytes
    for block_id in (0, 1, 2):
        assert pool.set_nbytes(block_id, 40)
    assert pool.stats().bytes_used == 120
    assert pool.evict_over_budget() == ()
    assert pool.stats().over_budget
    pool.release([A, B])
    assert pool.free_queue() == (2, 1, 0, 3)
    assert pool.evict_over_budget() == (2,)
    stats = pool.stats()
    assert (stats.bytes_used, stats.max_bytes, stats.num_blocks) == (80, 100, 3)
    assert not stats.over_budget
    assert not pool.set_nbytes(2, 40)  # reported after eviction: ignored
    assert pool.set_nbytes(1, 70)  # a size may be corrected
    assert pool.stats().bytes_used == 110
    assert pool.evict_over_budget() == (1,)
    assert pool.stats().bytes_used == 40
    pool.check_invariants()


def test_legacy_block_budget_ignores_bytes():
    pool = BlockPool(4, Budget(max_blocks=2))
    pool.commit(A, SYSTEM + (9, 9, 9, 9))
    for block_id in (0, 1, 2):
        pool.set_nbytes(block_id, 10**9)
    pool.release([A])
    assert pool.evict_over_budget() == (2,)
    assert pool.stats().bytes_used == 2 * 10**9
    assert not pool.stats().over_budget


def test_both_limits_apply():
    pool = BlockPool(4, Budget(max_bytes=1000, max_blocks=1))
    pool.commit(A, SYSTEM + (9, 9, 9, 9))
    pool.release([A])
    assert pool.evict_over_budget() == (2, 1)


def test_invalid_configuration_is_rejected():
    with pytest.raises(ValueError):
        BlockPool(0)
    with pytest.raises(ValueError):
        Budget(max_bytes=-1)
    with pytest.raises(ValueError):
        Budget(max_blocks=-1)


# -- model check -----------------------------------------------------------------------------

REQUESTS = [RequestId(f"r{i}") for i in range(4)]
requests = st.sampled_from(REQUESTS)
# shared starts (like system prompts) plus a random tail, so hits and prefix hits are common
STARTS = [(), (0, 0, 0, 0), (0, 0, 0, 0, 1, 1, 1, 1), (0, 0, 0, 0, 1, 1, 2, 2), (1, 2, 1, 2, 1, 2)]
prompts = st.builds(
    lambda start, tail: start + tuple(tail),
    st.sampled_from(STARTS),
    st.lists(st.integers(0, 2), max_size=5),
)
salts = st.sampled_from([(), (), ("s",)])


class PoolMachine(RuleBasedStateMachine):
    """Random traffic against a shadow model of what each block holds and who leases it."""

    @initialize(
        block_size=st.integers(2, 4),
        max_blocks=st.none() | st.integers(0, 12),
        max_bytes=st.none() | st.integers(0, 100),
    )
    def setup(self, block_size, max_blocks, max_bytes):
        self.pool = BlockPool(block_size, Budget(max_bytes=max_bytes, max_blocks=max_blocks))
        self.bs = block_size
        self.content: dict[int, tuple] = {}  # block id -> (extra_keys, token ids up to its end)
        self.leases: dict[str, set[int]] = collections.defaultdict(set)
        self.nbytes: dict[int, int] = {}
        self.budget = self.pool.budget
        self.max_id = -1

    def _expected_run(self, tokens, salt, max_blocks) -> tuple[int, ...]:
        by_content = {v: k for k, v in self.content.items()}
        run = []
        for i in range(max_blocks):
            block_id = by_content.get((salt, tokens[: (i + 1) * self.bs], False))
            if block_id is None:
                break
            run.append(block_id)
        return tuple(run)

    def _expected_hit(self, tokens, salt) -> int:
        """All but the last token at most: the full-block run, then the most tokens any entry
        starting right after it shares with the prompt (every entry is all-KV here)."""
        limit = len(tokens) - 1
        run = self._expected_run(tokens, salt, max(0, limit // self.bs))
        best = 0
        for depth in range(len(run) + 1):
            base = depth * self.bs
            best = max(best, base if depth else 0)
            for entry_salt, covered, is_tail in self.content.values():
                start = (len(covered) - 1) // self.bs * self.bs if not is_tail else len(covered) // self.bs * self.bs
                if entry_salt != salt or start != base or covered[:base] != tokens[:base]:
                    continue
                n = common_length(covered[base:], tokens[base:])
                best = max(best, base + min(n, limit - base))
        return best

    def _tails_of(self, block_id: int) -> list[int]:
        salt, covered, is_tail = self.content[block_id]
        if is_tail:
            return []
        return [
            b
            for b, (s, c, t) in self.content.items()
            if t and s == salt and len(c) // self.bs * self.bs == len(covered) and c[: len(covered)] == covered
        ]

    def _unleased(self) -> set[int]:
        leased = set().union(*self.leases.values())
        return set(self.content) - leased

    @rule(request=requests, tokens=prompts, salt=salts)
    def lookup(self, request, tokens, salt):
        expected = self._expected_hit(tokens, salt)
        hit = self.pool.lookup(request, tokens, salt)
        assert hit.num_cached_tokens == expected <= max(0, len(tokens) - 1)
        for i, block_id in enumerate(hit.block_ids):
            entry_salt, covered, _ = self.content[block_id]
            start = i * self.bs
            assert entry_salt == salt and covered[:start] == tokens[:start]
            if i < len(hit.block_ids) - 1:
                assert covered == tokens[: start + self.bs]
        if hit.block_ids:
            assert tokens[: hit.num_cached_tokens] == self.content[hit.block_ids[-1]][1][: hit.num_cached_tokens]
        eligible = max(0, (len(tokens) - 1) // self.bs)
        kind = "miss" if not expected else "hit" if expected >= eligible * self.bs else "prefix_hit"
        assert hit.kind == kind
        self.leases[request].update(hit.block_ids)

    @rule(request=requests, tokens=prompts, salt=salts, tail=st.none() | st.integers(1, 12))
    def commit(self, request, tokens, salt, tail):
        num_full = len(tokens) // self.bs
        known = self._expected_run(tokens, salt, num_full)
        tail_at = None if tail is None or tail > len(tokens) else tail
        created = self.pool.commit(request, tokens, salt, tail_at=tail_at)
        full = [b for b in created if not b.is_tail]
        assert [b.block_index for b in full] == list(range(len(known), num_full))
        for b in created:
            assert b.block_id > self.max_id  # never reused
            self.max_id = b.block_id
            if b.is_tail:
                assert b.token_end == tail_at and b.token_start == tail_at // self.bs * self.bs < tail_at
                self.content[b.block_id] = (salt, tokens[:tail_at], True)
            else:
                assert b.token_start == b.block_index * self.bs
                assert b.token_end == b.token_start + self.bs
                self.content[b.block_id] = (salt, tokens[: b.token_end], False)
            self.nbytes[b.block_id] = 0
        held = self.pool.cached_prefix(tokens, salt)
        assert held == self._expected_run(tokens, salt, num_full)
        assert len(held) == num_full
        self.leases[request].update(held)
        if tail_at is not None and tail_at % self.bs:
            by_content = {v: k for k, v in self.content.items()}
            self.leases[request].add(by_content[(salt, tokens[:tail_at], True)])

    @rule(released=st.lists(requests, max_size=3))
    def release(self, released):
        self.pool.release(released)
        for request in released:
            self.leases.pop(request, None)

    @rule(data=st.data(), nbytes=st.integers(0, 40))
    def set_nbytes(self, data, nbytes):
        block_id = data.draw(st.integers(0, self.max_id + 1))
        assert self.pool.set_nbytes(block_id, nbytes) == (block_id in self.content)
        if block_id in self.content:
            self.nbytes[block_id] = nbytes

    def _over(self, dropped) -> bool:
        kept = set(self.content) - set(dropped)
        max_bytes, max_blocks = self.budget.max_bytes, self.budget.max_blocks
        return (max_bytes is not None and sum(self.nbytes[b] for b in kept) > max_bytes) or (
            max_blocks is not None and len(kept) > max_blocks
        )

    @rule()
    def evict(self):
        queue = self.pool.free_queue()
        unleased = self._unleased()
        evicted = self.pool.evict_over_budget()
        # from the front of the free queue until the excess ends, or all of it; a full block
        # takes the tails right after it along
        expected: list[int] = []
        rest = list(queue)
        while rest and self._over(expected):
            block_id = rest.pop(0)
            expected += [block_id, *(t for t in self._tails_of(block_id) if t in rest)]
            rest = [b for b in rest if b not in expected]
        assert list(evicted) == expected
        assert set(evicted) <= unleased
        for block_id in evicted:
            del self.content[block_id]
            del self.nbytes[block_id]
        assert self.pool.stats().over_budget == self._over(())

    @rule()
    def clear(self):
        unleased = self._unleased()
        assert set(self.pool.clear()) == unleased
        for block_id in unleased:
            del self.content[block_id]
            del self.nbytes[block_id]

    @invariant()
    def consistent(self):
        self.pool.check_invariants()
        stats = self.pool.stats()
        assert stats.num_blocks == len(self.content)
        assert all(block_id in self.pool for block_id in self.content)
        counts = collections.Counter(b for lease in self.leases.values() for b in lease)
        for block_id in self.content:
            assert self.pool.ref_count(block_id) == counts[block_id]
        for request in REQUESTS:
            assert set(self.pool.holders(request)) == self.leases.get(request, set())
        assert set(self.pool.free_queue()) == self._unleased()
        assert stats.bytes_used == sum(self.nbytes.values())
        assert stats.over_budget == self._over(())


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None, database=None)
