"""worker/speculative/ragged.py: rows of a batched KV cache keep their own number of the inputs written, with no
rejected key left visible, and a cache whose padding grew is rebuilt with every row's keys intact."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.mlx


def _batch(lengths: list[int]):
    """A BatchKVCache whose row ``i`` holds ``lengths[i]`` keys valued ``100 * i + position`` (values alike)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache

    rows = []
    for i, n in enumerate(lengths):
        cache = KVCache()
        keys = (100 * i + mx.arange(n, dtype=mx.float32)).reshape(1, 1, n, 1)
        cache.update_and_fetch(keys, keys)
        rows.append(cache)
    return BatchKVCache.merge(rows)


def _rows(layer) -> list[list[float]]:
    """Each row's visible keys (its padding cut off)."""
    padding = layer.left_padding.tolist()
    keys = layer.keys[..., : layer._idx, 0]
    return [keys[i, 0, padding[i] :].tolist() for i in range(len(padding))]


def test_each_row_keeps_its_own_count_and_the_next_write_follows_its_last_kept_key():
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.ragged import keep_rows, row_lengths

    layer = _batch([3, 5, 2])
    written = mx.full((3, 1, 4, 1), -1.0)  # four verified inputs a row (their keys -1)
    layer.update_and_fetch(written, written)
    keep_rows([layer], 4, [1, 4, 0])
    assert row_lengths([layer]) == [4, 9, 2]
    assert _rows(layer) == [[0, 1, 2, -1], [100, 101, 102, 103, 104, -1, -1, -1, -1], [200, 201]]
    assert layer.offset.tolist() == [4, 9, 2]  # RoPE positions follow the kept tokens
    mask = layer.make_mask(1)  # the next query sees exactly each row's own keys, and itself
    assert mask.reshape(3, -1).sum(axis=-1).tolist() == [5, 10, 3]
    nxt = mx.full((3, 1, 1, 1), 7.0)
    layer.update_and_fetch(nxt, nxt)
    assert [row[-2:] for row in _rows(layer)] == [[-1, 7], [-1, 7], [201, 7]]


def test_padding_every_row_shares_is_cut_so_the_batch_is_as_long_as_its_longest_row():
    import mlx.core as mx

    from vllm_mlx_trio.worker.speculative.ragged import keep_rows, row_lengths

    cache = [_batch([2, 2])]
    for keep in ([1, 5], [5, 1]) * 3:  # each row in turn keeps less than the other
        inputs = mx.zeros((2, 1, 5, 1))
        cache[0].update_and_fetch(inputs, inputs)
        keep_rows(cache, 5, keep)
    assert row_lengths(cache) == [20, 20]
    assert cache[0]._idx == 20 and cache[0].left_padding.tolist() == [0, 0]  # not 2 + 6 * 5 = 32 slots
    assert [row[:2] for row in _rows(cache[0])] == [[0, 1], [100, 101]]
