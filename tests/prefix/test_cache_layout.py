"""Which cache layers the prefix cache can restore; a model it cannot cache is served uncached
and says so once."""

from __future__ import annotations

import logging

import pytest
from mlx_lm.models.cache import ArraysCache, ChunkedKVCache, KVCache, QuantizedKVCache, RotatingKVCache

from vllm_mlx_trio.worker.prefix.kv_store import PrefixBlocks
from vllm_mlx_trio.worker.prefix.layers import cache_layout

pytestmark = pytest.mark.mlx


class FakeModel:
    def __init__(self, make):
        self.make_cache = make
        self.layers = [None]


@pytest.mark.parametrize(
    ("layers", "kinds", "blocks_end_hits"),
    [
        (lambda: [KVCache(), KVCache()], ("kv", "kv"), True),
        (lambda: [RotatingKVCache(max_size=8), KVCache()], ("window", "kv"), False),
        (lambda: [ArraysCache(size=2), KVCache()], ("state", "kv"), False),
        (lambda: [ArraysCache(size=2), ArraysCache(size=2)], ("state", "state"), False),  # mamba
    ],
)
def test_layouts_of_cachable_models(layers, kinds, blocks_end_hits):
    layout = cache_layout(FakeModel(layers))
    assert layout.cachable and layout.kinds == kinds and layout.blocks_end_hits == blocks_end_hits
    assert layout.knows_position == ("kv" in kinds)  # a recurrent-only cache does not say


@pytest.mark.parametrize(
    ("layers", "named"),
    [
        (lambda: [QuantizedKVCache(), KVCache()], "QuantizedKVCache"),
        (lambda: [ChunkedKVCache(16), KVCache()], "ChunkedKVCache"),
        (lambda: [RotatingKVCache(max_size=8, keep=4)], "RotatingKVCache"),  # keeps a prefix: not restored
    ],
)
def test_an_uncachable_model_is_served_uncached_and_says_so_once(caplog, layers, named):
    with caplog.at_level(logging.WARNING):
        prefix = PrefixBlocks(FakeModel(layers), 16, enabled=True)
    assert not prefix.enabled and not prefix.layout.cachable
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and named in warnings[0] and "serving uncached" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert not PrefixBlocks(FakeModel(layers), 16, enabled=False).enabled
    assert not caplog.records  # a cache switched off says nothing
