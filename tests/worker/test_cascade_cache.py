"""The cascade batch cache (worker/cascade/batch_cache.py) on a small random qwen3 model: decode steps over rows
that hold only their suffix after one shared prefix give the logits of mlx-lm's own batch cache holding each
row's whole KV, through merge, extend (same prefix, a longer prefix, a diverging one), filter and extract."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache, make_prompt_cache
from mlx_lm.utils import _get_classes

from vllm_mlx_trio.worker.cascade.attention import install
from vllm_mlx_trio.worker.cascade.batch_cache import CascadeBatchKVCache, SharedPrefix, SharedRowCache

pytestmark = pytest.mark.mlx

BS = 8
CONFIG = {
    "model_type": "qwen3",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "num_hidden_layers": 2,
}


@pytest.fixture(scope="module")
def model():
    mx.random.seed(3)
    model_class, args_class = _get_classes(CONFIG)
    model = model_class(args_class.from_dict(CONFIG))
    model.set_dtype(mx.float32)
    install(model)
    return model


def tokens(seed: int, n: int) -> list[int]:
    return mx.random.randint(1, 250, (n,), key=mx.random.key(seed)).tolist()


def continued(model, start: list[KVCache] | None, ids: list[int]) -> list[KVCache]:
    """A row's whole cache: ``start``'s tokens (a copy, as a prefix-store hit gives), then ``ids`` computed."""
    cache = make_prompt_cache(model)
    if start is not None:
        for layer, base in zip(cache, start, strict=True):
            keys, values = mx.array(base.keys[..., : base.offset, :]), mx.array(base.values[..., : base.offset, :])
            layer.state = (keys, values, base.offset)
    model(mx.array([ids]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def group(block_ids: tuple, cache: list[KVCache]) -> SharedPrefix:
    n = len(block_ids) * BS
    return SharedPrefix(block_ids, BS, [c.keys[..., :n, :] for c in cache], [c.values[..., :n, :] for c in cache])


def batch(rows: list[tuple[list[KVCache], SharedPrefix | None, int]]) -> tuple[list, list]:
    """(plain batch, cascade batch) of the same rows: (whole cache, prefix, tokens of it shared)."""
    layers = range(len(rows[0][0]))
    plain = [BatchKVCache.merge([row[0][i] for row in rows]) for i in layers]
    shared = [CascadeBatchKVCache.merge([SharedRowCache.of(c[i], p, i, n) for c, p, n in rows]) for i in layers]
    return plain, shared


def assert_steps_equal(model, plain: list, shared: list, steps: int = 3) -> None:
    rows = plain[0].offset.shape[0]
    token = mx.array([[5 + i] for i in range(rows)])
    for _ in range(steps):
        want = model(token, cache=plain)[:, -1]
        got = model(token, cache=shared)[:, -1]
        assert mx.abs(want - got).max().item() < 1e-4
        token = want.argmax(-1)[:, None]
    assert (plain[0].offset == shared[0].offset).all().item()


def assert_extracts_equal(plain: list, shared: list, *, exact: bool = False) -> None:
    """Each row's whole cache: bitwise before any step; after steps the new tokens' keys and values differ by the
    attention's rounding (the layers after the first see the cascade's outputs)."""
    for i in range(plain[0].offset.shape[0]):
        for p, s in zip(plain, shared, strict=True):
            want, got = p.extract(i), s.extract(i)
            assert want.offset == got.offset
            for a, b in ((want.keys, got.keys), (want.values, got.values)):
                assert mx.array_equal(a, b) if exact else mx.allclose(a, b, atol=1e-4)


def test_rows_sharing_all_part_or_none_of_the_prefix(model):
    base = continued(model, None, tokens(0, 3 * BS))
    x = group((1, 2, 3), base)
    rows = [
        (continued(model, base, tokens(1, 5)), x, 3 * BS),
        (continued(model, [c for c in base], tokens(2, 9)), x, 2 * BS),  # uses the first two blocks only
        (continued(model, None, tokens(3, 4)), None, 0),
    ]
    plain, shared = batch(rows)
    assert shared[0].cascade_prefix is not None and shared[0].shared == [3 * BS, 2 * BS, 0]
    assert shared[0].shared_bytes_saved > 0
    assert_extracts_equal(plain, shared, exact=True)
    assert_steps_equal(model, plain, shared)
    assert_extracts_equal(plain, shared)
    for cache in (plain, shared):  # the sharing rows finish
        for layer in cache:
            layer.filter([2])
    assert shared[0].prefix is None and shared[0].shared_bytes_saved == 0
    assert_steps_equal(model, plain, shared)


def test_extend_adopts_a_longer_prefix_and_rebases_a_diverging_one(model):
    base = continued(model, None, tokens(0, 2 * BS))
    x = group((1, 2), base)
    longer_base = continued(model, base, tokens(4, BS))
    longer = group((1, 2, 3), longer_base)
    diverging_base = continued(model, [_first(c, BS) for c in base], tokens(5, BS))
    diverging = group((1, 9), diverging_base)

    first = [(continued(model, base, tokens(6, 3)), x, 2 * BS)]
    second = [(continued(model, longer_base, tokens(7, 2)), longer, 3 * BS)]
    third = [(continued(model, diverging_base, tokens(8, 4)), diverging, 2 * BS)]
    plain, shared = batch(first)
    for more in (second, third):
        plain_more, shared_more = batch(more)
        for p, s, pm, sm in zip(plain, shared, plain_more, shared_more, strict=True):
            p.extend(pm)
            s.extend(sm)
        assert_steps_equal(model, plain, shared, steps=2)
    assert shared[0].prefix is longer  # two rows use it; the diverging row keeps one block shared
    assert shared[0].shared == [2 * BS, 3 * BS, BS]
    assert_extracts_equal(plain, shared)


def _first(layer: KVCache, n: int) -> KVCache:
    cache = KVCache()
    cache.state = (layer.keys[..., :n, :], layer.values[..., :n, :], n)
    return cache


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16])
def test_half_precision_attention_rounds_as_mlx_own(dtype):
    """Probabilities rounded to the model's dtype and both value products summed before one rounding: the outputs
    are MLX's own attention's over the concatenated keys, bit for bit but for the rare float32 sum that rounds the
    other way (rounding each part's product separately moved most of them), so greedy tokens do not move."""
    from vllm_mlx_trio.worker.cascade.attention import cascade_attention

    rows, q_heads, kv_heads, dim, prefix_len, suffix_len = 3, 8, 4, 64, 300, 12
    key = mx.random.key(7)
    q, pk, pv, sk, sv = (
        mx.random.normal(shape, key=k).astype(dtype)
        for shape, k in zip(
            [
                (rows, q_heads, 1, dim),
                (1, kv_heads, prefix_len, dim),
                (1, kv_heads, prefix_len, dim),
                (rows, kv_heads, suffix_len, dim),
                (rows, kv_heads, suffix_len, dim),
            ],
            mx.random.split(key, 5),
            strict=True,
        )
    )
    keys = mx.concatenate([mx.broadcast_to(pk, (rows, kv_heads, prefix_len, dim)), sk], axis=2)
    values = mx.concatenate([mx.broadcast_to(pv, (rows, kv_heads, prefix_len, dim)), sv], axis=2)
    mask = mx.arange(suffix_len)[None, None, None, :] >= mx.array([0, 3, 5])[:, None, None, None]  # left padding
    whole_mask = mx.concatenate([mx.ones((rows, 1, 1, prefix_len), dtype=mx.bool_), mask], axis=-1)
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.125, mask=whole_mask)
    got = cascade_attention(q, sk, sv, (pk, pv), None, scale=0.125, mask=mask)
    assert got.dtype == dtype
    differ = (want != got).sum().item()  # a float32 sum lying on a rounding boundary may round the other way
    assert differ <= want.size // 100, f"{differ} of {want.size} differ"
