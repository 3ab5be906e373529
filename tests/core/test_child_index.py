"""The prefix cache's children by parent: the lookup's closest-first order, and its cost."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_mlx_trio.bench.prefix_lookup import SYSTEM_TOKENS, TURN_HEADER
from vllm_mlx_trio.cli import main
from vllm_mlx_trio.core.prefix import child_index
from vllm_mlx_trio.core.prefix.child_index import ChildIndex, common_length

PARENT = b"p"
token_runs = st.lists(st.integers(0, 3), max_size=6).map(tuple)


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(st.tuples(token_runs, st.sampled_from(["", "img"])), max_size=25), rest=token_runs)
def test_closest_yields_every_child_sharing_a_token_then_the_empty_ones_most_shared_first(runs, rest):
    index, expected = ChildIndex(), set()
    for block_id, (tokens, media_key) in enumerate(dict.fromkeys(runs)):
        media = ((0, media_key),) if media_key else ()
        index.add(PARENT, tokens, block_id, media)
        shared = common_length(tokens, rest)
        if shared or not tokens:
            expected.add((shared, tokens, block_id))
    got = list(index.closest(PARENT, rest))
    assert set(got) == expected and len(got) == len(expected)
    shares = [shared for shared, _, _ in got]
    assert shares == sorted(shares, reverse=True)


def test_removed_children_leave_the_order_and_the_index():
    index = ChildIndex()
    for block_id, tokens in enumerate([(1, 2, 3), (1, 2), (1, 5), ()]):
        index.add(PARENT, tokens, block_id)
    index.remove(PARENT, (1, 2))
    assert list(index.closest(PARENT, (1, 2, 9))) == [(2, (1, 2, 3), 0), (1, (1, 5), 2), (0, (), 3)]
    for tokens in [(1, 2, 3), (1, 5), ()]:
        index.remove(PARENT, tokens)
    assert len(index) == 0 and list(index.closest(PARENT, (1,))) == [] and list(index.under(PARENT)) == []


def test_the_closest_child_is_found_without_reading_every_child(monkeypatch):
    """A parent with a child per conversation (all starting alike): the best child comes after
    a handful of comparisons, not one per child."""
    index = ChildIndex()
    for conversation in range(20_000):
        index.add(PARENT, (7, 7, conversation // 100, conversation % 100, 5), conversation)
    calls = []

    def counted(a, b):
        calls.append(1)
        return common_length(a, b)

    monkeypatch.setattr(child_index, "common_length", counted)
    shared, tokens, block_id = next(index.closest(PARENT, (7, 7, 123, 45, 9, 9)))
    assert (shared, tokens, block_id) == (4, (7, 7, 123, 45, 5), 12_345)
    assert len(calls) <= 4


def test_the_prefix_lookup_bench_reports_the_shared_prompt_hit_at_each_fill(tmp_path, capsys):
    out = tmp_path / "lookup.json"
    assert main(["bench", "prefix-lookup", "--conversations", "3,30", "--lookups", "4", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["conversations"] for r in rows] == [3, 30]
    # the system prompt's two blocks, then the turn header every cached conversation shares
    assert all(r["cached_tokens"] == SYSTEM_TOKENS + len(TURN_HEADER) and r["lookup_ms"] > 0 for r in rows)
    assert "prefix-cache lookup on the event loop" in capsys.readouterr().out
