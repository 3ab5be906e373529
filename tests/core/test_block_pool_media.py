"""Media-position keys in the prefix cache: text before an image is shared, nothing after it.

The rule: block ``i`` folds the key of every media item starting inside it (and so,
through the hash chain, every later block); a tail at ``t`` folds the keys starting before
``t``; a key never folds into an entry ending at or before its start.
"""

from __future__ import annotations

import collections

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx_trio.actors.prefix.cache_manager import CacheManagerActor
from vllm_mlx_trio.actors.prefix.kv_events import KVEventRecorder, external_hash
from vllm_mlx_trio.core.prefix.block_hash import block_hash
from vllm_mlx_trio.core.prefix.block_pool import BlockPool
from vllm_mlx_trio.core.prefix.media_keys import chain_hashes, first_difference, media_between, normalize_media_keys
from vllm_mlx_trio.messages import PrefixCommit, PrefixLookup, RequestId

A, B = RequestId("a"), RequestId("b")
SIZE = 4

tokens_st = st.lists(st.integers(0, 3), min_size=1, max_size=20).map(tuple)


def media_st(max_position: int = 24):
    """Sorted (position, key) lists with few distinct keys, so equal and unequal lists both occur."""
    item = st.tuples(st.integers(0, max_position), st.sampled_from(["img-a", "img-b", "vid-c"]))
    return st.lists(item, max_size=3).map(normalize_media_keys)


def agree_until(a, b) -> float:
    """The first position at which two media lists differ; infinity when they are equal."""
    d = first_difference(a, b)
    return float("inf") if d is None else d


@given(tokens=tokens_st, media=media_st())
def test_a_key_folds_only_from_the_block_it_starts_in(tokens, media):
    with_media = list(chain_hashes(tokens, (), media, SIZE, len(tokens) // SIZE))
    without = list(chain_hashes(tokens, (), (), SIZE, len(tokens) // SIZE))
    first = media[0][0] if media else float("inf")
    for index, (h_media, h_plain) in enumerate(zip(with_media, without, strict=True)):
        end = (index + 1) * SIZE
        assert (h_media == h_plain) == (end <= first), (index, media)


@given(tokens=tokens_st, a=media_st(), b=media_st())
def test_two_media_lists_share_exactly_the_blocks_ending_before_they_differ(tokens, a, b):
    num = len(tokens) // SIZE
    hashes_a = list(chain_hashes(tokens, ("salt",), a, SIZE, num))
    hashes_b = list(chain_hashes(tokens, ("salt",), b, SIZE, num))
    differ = agree_until(a, b)
    for index in range(num):
        assert (hashes_a[index] == hashes_b[index]) == ((index + 1) * SIZE <= differ)


def test_no_media_gives_the_old_hash_and_media_changes_it():
    chunk = (1, 2, 3, 4)
    assert block_hash(None, chunk, ("s",), ()) == block_hash(None, chunk, ("s",))
    assert block_hash(None, chunk, (), ((1, "img"),)) != block_hash(None, chunk, ())
    assert block_hash(None, chunk, (), ((1, "img"),)) != block_hash(None, chunk, (), ((2, "img"),))
    # a media key never looks like an extra key
    assert block_hash(None, chunk, ((1, "img"),)) != block_hash(None, chunk, (), ((1, "img"),))


@settings(max_examples=200, deadline=None)
@given(tokens=tokens_st, a=media_st(), b=media_st(), tail=st.booleans())
def test_a_plain_kv_hit_reaches_exactly_where_the_media_differ(tokens, a, b, tail):
    """Request A computed the prompt with media ``a``; B shows ``b``. B reuses every token
    before the first differing media start (token-granular: blocks, then inside an entry)."""
    pool = BlockPool(SIZE)
    pool.commit(A, tokens, (), a, tail_at=len(tokens) if tail else None)
    hit = pool.lookup(B, tokens, (), b)
    covered = len(tokens) if tail else len(tokens) // SIZE * SIZE
    assert hit.num_cached_tokens == min(len(tokens) - 1, agree_until(a, b), covered)
    pool.check_invariants()


@settings(max_examples=200, deadline=None)
@given(tokens=tokens_st, a=media_st(), b=media_st())
def test_a_checkpoint_hit_needs_every_key_before_the_checkpoint(tokens, a, b):
    """Sliding-window / recurrent models end a hit only at a checkpoint: B (the prompt plus one
    token) hits A's checkpoint at ``len(tokens)`` iff their media agree before it."""
    pool = BlockPool(SIZE)
    pool.commit(A, tokens, (), a, tail_at=len(tokens), blocks_end_hits=False)
    hit = pool.lookup(B, (*tokens, 9), (), b)
    same_before = agree_until(media_between(a, 0, len(tokens)), media_between(b, 0, len(tokens))) >= len(tokens)
    assert hit.num_cached_tokens == (len(tokens) if same_before else 0)
    pool.check_invariants()


@given(tokens=st.lists(st.integers(0, 3), min_size=SIZE, max_size=12).map(tuple), position=st.integers(0, 11))
def test_same_tokens_different_images_are_two_entries(tokens, position):
    """Equal token runs under one parent, one per image: both cached, each found by its own."""
    pool = BlockPool(SIZE)
    position = min(position, len(tokens) - 1)
    image_a, image_b = ((position, "img-a"),), ((position, "img-b"),)
    new_a = pool.commit(A, tokens, (), image_a, tail_at=len(tokens))
    new_b = pool.commit(B, tokens, (), image_b, tail_at=len(tokens))
    ids_a = {n.block_id for n in new_a}
    assert not ids_a & {n.block_id for n in new_b}
    assert len(new_b) == len(new_a) - position // SIZE  # the blocks before the image are shared
    pool.check_invariants()
    again = pool.lookup(RequestId("c"), (*tokens, 0), (), image_a)
    assert again.num_cached_tokens == len(tokens) and set(again.block_ids) <= ids_a | set(pool.holders(A))


def test_text_before_the_first_image_is_shared_between_different_images():
    pool = BlockPool(SIZE)
    system = (1, 2, 3, 4, 5, 6, 7, 8)
    prompt = (*system, 50, 50, 50, 50, 9, 9)  # image tokens at 8..11
    pool.commit(A, prompt, (), ((8, "cat"),), tail_at=len(prompt))
    other = pool.lookup(B, prompt, (), ((8, "dog"),))
    assert other.num_cached_tokens == 8 and other.kind == "prefix_hit"
    same = pool.lookup(RequestId("c"), prompt, (), ((8, "cat"),))
    assert same.num_cached_tokens == len(prompt) - 1


def test_kv_events_publish_the_hashes_the_pool_keys_blocks_by():
    sent: list[bytes] = []
    actor = CacheManagerActor(
        command_recv=None, reply_send=None, cfg=_cache_config(), kv_events=KVEventRecorder(sent.append)
    )
    tokens = tuple(range(12))
    media = ((5, "img"),)
    actor._handle(PrefixLookup(request_id=A, prompt_token_ids=tokens, media_keys=media))
    actor._handle(PrefixCommit(request_id=A, token_ids=tokens, media_keys=media, block_nbytes=(1, 1, 1)))
    actor._kv_events.flush()
    _, events, _ = msgspec.msgpack.decode(sent[0])
    expected = [external_hash(h) for h in chain_hashes(tokens, (), media, SIZE, 3)]
    assert [e[1][0] for e in events] == expected
    assert [e[2] for e in events] == [None, expected[0], expected[1]]  # parents follow the media chain
    held = actor._pool.cached_prefix(tokens, (), media)
    assert [external_hash(actor._pool.block_info(b).block_hash) for b in held] == expected
    assert actor._pool.cached_prefix(tokens) == held[:1]  # without the image only block 0 matches


def _cache_config():
    from vllm_mlx_trio.config import CacheConfig

    return CacheConfig(block_size=SIZE, memory_aware=False)


@settings(max_examples=60, deadline=None)
@given(
    traffic=st.lists(
        st.tuples(st.sampled_from([A, B]), tokens_st, media_st(), st.booleans(), st.booleans()), max_size=12
    )
)
def test_random_traffic_with_media_keeps_the_pool_consistent(traffic):
    """Commits, lookups and releases with media: never a hit past a differing media key."""
    pool = BlockPool(SIZE)
    computed: dict[tuple, list] = collections.defaultdict(list)  # tokens -> media lists committed
    for request, tokens, media, is_commit, release in traffic:
        if is_commit:
            pool.commit(request, tokens, (), media, tail_at=len(tokens))
            computed[tokens].append(media)
        else:
            hit = pool.lookup(request, tokens, (), media)
            n = hit.num_cached_tokens
            # some committed prompt starts with the hit's tokens and agrees on the media before n
            assert n == 0 or any(
                done[:n] == tokens[:n] and agree_until(media_between(m, 0, n), media_between(media, 0, n)) >= n
                for done, lists in computed.items()
                for m in lists
            )
        if release:
            pool.release([request])
        pool.check_invariants()
