"""Cascade attention: every row's queries against one shared prefix, plus each row against its own suffix.

The batch's rows hold only the tokens after the prefix they share (their *suffix*, in mlx-lm's left-padded batch
layout); the prefix's keys and values are held once. Attention over both parts is the softmax over their
concatenation, computed exactly: the scores of both parts share one running maximum and one denominator (the
log-sum-exp merge), and each part's probabilities meet its own values. The prefix part folds every row's queries
into one axis per KV head, so it is one matrix product against the prefix (no mask, unless some rows use only the
first tokens of it), where a per-row batch would read the prefix once per row.

Models bind ``scaled_dot_product_attention`` from ``mlx_lm.models.base`` at import, so :func:`install` replaces that
name in the modules the model's layers come from with :func:`_dispatch`, which takes the cascade path for a
:class:`~.batch_cache.CascadeBatchKVCache` holding a prefix and calls the original otherwise.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import mlx.core as mx

#: What a masked score becomes (in float32): finite, as MLX's own attention masks, so a query whose every key is
#: masked (a padded position) averages its values instead of giving NaN.
MASKED = -3.0e38


def cascade_attention(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    prefix: tuple[mx.array, mx.array],
    shared: mx.array | None,
    *,
    scale: float,
    mask: Any,
) -> mx.array:
    """Attention of ``queries`` (B, Hq, L, D) over each row's prefix tokens then its suffix ``keys``/``values``
    (B, Hkv, S, D), merged exactly. ``prefix``: its keys and values (1, Hkv, P, D); ``shared``: how many of its
    tokens each row uses (B,), None when every row uses them all; ``mask``: the suffix's (mlx-lm's batch mask)."""
    batch, q_heads, length, dim = queries.shape
    prefix_keys, prefix_values = prefix
    kv_heads, prefix_len = prefix_keys.shape[1], prefix_keys.shape[2]
    repeats = q_heads // kv_heads
    folded_len = batch * repeats * length
    dtype = queries.dtype
    queries = (queries * scale).reshape(batch, kv_heads, repeats, length, dim)

    # The prefix part: (Hkv, B*rep*L, P), queries of every row folded into one axis.
    folded = queries.transpose(1, 0, 2, 3, 4).reshape(kv_heads, folded_len, dim)
    prefix_scores = (folded @ prefix_keys[0].swapaxes(-1, -2)).astype(mx.float32)
    if shared is not None:
        row_of = mx.repeat(shared, repeats * length)  # each folded query's row's shared length
        used = mx.arange(prefix_len)[None, :] < row_of[:, None]
        prefix_scores = mx.where(used, prefix_scores, MASKED)

    # Each row's suffix: (B, Hkv, rep, L, S).
    suffix_scores = (queries @ keys[:, :, None].swapaxes(-1, -2)).astype(mx.float32)
    suffix_mask = _suffix_mask(mask, length, keys.shape[2])
    if suffix_mask is not None:
        suffix_scores = mx.where(suffix_mask, suffix_scores, MASKED)

    prefix_max = _unfold(prefix_scores.max(axis=-1, keepdims=True), batch, repeats, length)
    top = mx.maximum(prefix_max, suffix_scores.max(axis=-1, keepdims=True))
    prefix_probs = mx.exp(prefix_scores - _fold(top, folded_len))
    suffix_probs = mx.exp(suffix_scores - top)
    total = _unfold(prefix_probs.sum(axis=-1, keepdims=True), batch, repeats, length)
    total = total + suffix_probs.sum(axis=-1, keepdims=True)
    # Probabilities rounded to the model's dtype, as MLX's attention rounds them; both value products summed in
    # float32 and rounded once, as its one product over all the keys is (so half-precision outputs match it).
    prefix_probs = _rounded(prefix_probs / _fold(total, folded_len), dtype)
    suffix_probs = _rounded(suffix_probs / total, dtype)
    prefix_out = prefix_probs @ prefix_values[0].astype(mx.float32)
    suffix_out = suffix_probs @ values[:, :, None].astype(mx.float32)
    out = _unfold(prefix_out, batch, repeats, length) + suffix_out
    return out.astype(dtype).reshape(batch, q_heads, length, -1)


def _rounded(probs: mx.array, dtype: mx.Dtype) -> mx.array:
    """Float32 probabilities rounded to ``dtype``'s precision (kept in float32)."""
    return probs if dtype == mx.float32 else probs.astype(dtype).astype(mx.float32)


def _unfold(folded: mx.array, batch: int, repeats: int, length: int) -> mx.array:
    """(Hkv, B*rep*L, X) to (B, Hkv, rep, L, X)."""
    kv_heads, _, last = folded.shape
    return folded.reshape(kv_heads, batch, repeats, length, last).transpose(1, 0, 2, 3, 4)


def _fold(unfolded: mx.array, folded_len: int) -> mx.array:
    """(B, Hkv, rep, L, X) to (Hkv, B*rep*L, X)."""
    kv_heads, last = unfolded.shape[1], unfolded.shape[-1]
    return unfolded.transpose(1, 0, 2, 3, 4).reshape(kv_heads, folded_len, last)


def _suffix_mask(mask: Any, length: int, suffix_len: int) -> mx.array | None:
    """The suffix mask broadcast over the query-head groups: (B or 1, 1, 1, L, S) boolean, or None."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "causal": the queries are the last ``length`` suffix positions
        queries = mx.arange(suffix_len - length, suffix_len)
        mask = queries[:, None] >= mx.arange(suffix_len)[None]
    if mask.dtype != mx.bool_:
        raise TypeError("cascade attention takes a boolean mask")
    while mask.ndim < 4:
        mask = mask[None]
    return mask[:, :, None]


def _dispatch(original: Callable[..., mx.array]) -> Callable[..., mx.array]:
    def scaled_dot_product_attention(queries, keys, values, cache, scale, mask, sinks=None, **kwargs):
        prefix = getattr(cache, "cascade_prefix", None)
        if prefix is None or sinks is not None or kwargs:
            return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks, **kwargs)
        cache.cascade_calls += 1
        return cascade_attention(queries, keys, values, prefix, cache.cascade_shared, scale=scale, mask=mask)

    scaled_dot_product_attention.cascade_original = original  # type: ignore[attr-defined]
    return scaled_dot_product_attention


def install(model: Any) -> list[str]:
    """Route the attention of ``model``'s layers through the cascade dispatch; the modules patched (a module already
    patched is left as it is). A layer whose module calls MLX's attention another way is not routed: the caller
    checks that every cascade layer was (``cascade_calls``)."""
    names = sorted({type(module).__module__ for _, module in model.named_modules()})
    patched = []
    for name in names:
        module = sys.modules.get(name)
        original = getattr(module, "scaled_dot_product_attention", None)
        if original is None or not callable(original):
            continue
        if not hasattr(original, "cascade_original"):
            module.scaled_dot_product_attention = _dispatch(original)
        patched.append(name)
    return patched
