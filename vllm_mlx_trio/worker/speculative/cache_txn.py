"""The cache transaction around a verify forward, for target caches that cannot be trimmed.

A verify forward of ``[last, d1..dk]`` writes all ``k + 1`` tokens into the target's cache; only the first ``n`` stay
(``last`` and the accepted drafts). Attention caches (``KVCache``) roll back by trimming. Linear-attention and SSM
layers (mlx-lm's ``ArraysCache``: GatedDeltaNet's conv and recurrent state) fold every token into one state that
cannot be un-folded, so :class:`CacheTransaction` snapshots those states before the verify and, when some tokens
are rejected, restores them and folds in the ``n`` kept tokens again:

* replay (Qwen3.5 / Qwen3-Next, layers with a ``linear_attn`` mixer): during the verify forward each such mixer's
  input is recorded; ``keep(n)`` runs only those mixers again over the first ``n`` recorded positions. By causality
  those inputs are the ones a forward of just the kept tokens produces, so the states are the same; the test
  (tests/spec/test_mtp_cache_txn.py) checks them equal, array for array, to a plain forward of the kept tokens.
* re-forward (any other non-trimmable cache): restore every layer and forward the ``n`` kept tokens through the whole
  model again: exact by construction, one more forward of ``n`` tokens.

When all tokens are kept nothing is redone. MLX thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import ArraysCache, can_trim_prompt_cache, make_prompt_cache


def needs_transaction(cache: Sequence[Any]) -> bool:
    """Whether rolling ``cache`` back needs a transaction (some layer cannot be trimmed)."""
    return not can_trim_prompt_cache(list(cache))


def rollback_problem(model: Any) -> str | None:
    """Why dropping rejected drafts from this model's cache would not work, or None if it does.

    A trimmable cache is trimmed (mlx-lm's own path). Any other goes through :class:`CacheTransaction`, which needs
    each layer's state to be snapshotted and set back: checked once at load by rolling a 2-token verify back to 1
    token and comparing the next token's logits with those of a plain forward (a cache type whose ``state`` cannot be
    set, or sets nothing, fails here instead of failing or corrupting requests later: the attention layers' offsets
    must match too)."""
    if can_trim_prompt_cache(make_prompt_cache(model)):
        return None
    reference = make_prompt_cache(model)
    expected = model(mx.array([[0, 1, 2]]), cache=reference)[:, -1]
    cache = make_prompt_cache(model)
    try:
        model(mx.array([[0]]), cache=cache)
        transaction = open_transaction(model, cache, [1, 1])
        model(mx.array([[1, 1]]), cache=cache)
        transaction.keep(1)
        got = model(mx.array([[2]]), cache=cache)[:, -1]
        mx.eval(expected, got)
    except Exception as exc:  # boundary: whatever the model's cache types raise
        names = sorted({type(layer).__name__ for layer in cache})
        return f"the model's cache ({', '.join(names)}) cannot be rolled back: {type(exc).__name__}: {exc}"
    scale = mx.abs(expected).max().item() or 1.0
    differs = mx.abs(got.astype(mx.float32) - expected.astype(mx.float32)).max().item() > ROLLBACK_TOLERANCE * scale
    if differs or _offsets(cache) != _offsets(reference):
        names = sorted({type(layer).__name__ for layer in cache})
        return f"rolling the model's cache ({', '.join(names)}) back does not restore it"
    return None


def _offsets(cache: Sequence[Any]) -> list[int | None]:
    return [getattr(layer, "offset", None) for layer in cache]


#: Largest difference, relative to the largest logit, between the logits after a rolled-back verify and those of a
#: plain forward that still counts as equal: bf16 rounding differs between a 2-token and a 1-token forward; a cache
#: that was not restored differs by the order of the logits themselves.
ROLLBACK_TOLERANCE = 0.05


def open_transaction(model: Any, cache: Sequence[Any], inputs: Sequence[int] | mx.array) -> CacheTransaction:
    """Snapshot ``cache`` before the verify forward of ``inputs`` (the speculative runner's ``_transaction``)."""
    return CacheTransaction(model, cache, inputs)


class _MixerTap(nn.Module):
    """Stands in for a layer's ``linear_attn`` during one verify forward and keeps its input."""

    def __init__(self, mixer: nn.Module):
        super().__init__()
        self.mixer = mixer
        self.recorded: tuple[mx.array, mx.array | None] | None = None

    def __call__(self, x: mx.array, mask: mx.array | None = None, cache: Any = None) -> mx.array:
        self.recorded = (x, mask)
        return self.mixer(x, mask, cache)


class CacheTransaction:
    """A snapshot of a target's per-layer cache before the verify forward of ``verified``; :meth:`keep` settles it.

    ``verified`` are the tokens that forward writes (``[last, d1..dk]``); ``model`` replays the kept ones.
    """

    def __init__(self, model: Any, cache: Sequence[Any], verified: Sequence[int] | mx.array):
        self._model = model
        self._cache = list(cache)
        # kept on the device (the verify's inputs may still be lazy); only a re-forward reads them
        self._verified = verified if isinstance(verified, mx.array) else mx.array(list(verified), dtype=mx.int32)
        self._saved = [_snapshot(layer_cache) for layer_cache in self._cache]
        self._taps = _install_taps(model, self._cache)
        self._open = True

    def keep(self, n: int) -> None:
        """Leave the cache as if only ``verified[:n]`` had been forwarded since the snapshot (``0 <= n <= k + 1``)."""
        if not self._open:
            raise RuntimeError("the cache transaction was already settled")
        if not 0 <= n <= self._verified.size:
            raise ValueError(f"keep {n} of {self._verified.size} verified tokens")
        recorded = self._remove_taps()
        self._open = False
        if n == self._verified.size:
            return  # everything stays: the cache already holds exactly these tokens
        if recorded is not None:  # replay: attention caches keep n, each linear-attention state folds n in again
            for layer_cache, saved in zip(self._cache, self._saved, strict=True):
                _restore(layer_cache, saved, keep=n)
            for index, (mixer, (x, mask)) in recorded.items():
                if n:
                    mixer(x[:, :n], None if mask is None else mask[..., :n], self._cache[index])
        else:  # re-forward
            self._restore()
            if n:
                self._model(self._verified[None, :n], cache=self._cache)
        # left lazy: the next forward evaluates the states with its own work (no synchronisation here)

    def rollback(self) -> None:
        """Restore every layer to the snapshot (the verified tokens are all dropped)."""
        self._remove_taps()
        self._restore()
        self._open = False

    def _restore(self) -> None:
        for layer_cache, saved in zip(self._cache, self._saved, strict=True):
            _restore(layer_cache, saved)

    def _remove_taps(self) -> dict[int, tuple[nn.Module, tuple[mx.array, mx.array | None]]] | None:
        """Put the mixers back; their recorded inputs by layer index, or None when replay cannot cover every
        non-trimmable layer (then the whole model re-forwards)."""
        recorded, self._taps = remove_taps(self._taps), {}
        untapped = [i for i, c in enumerate(self._cache) if not c.is_trimmable() and i not in recorded]
        return None if untapped else recorded


def _install_taps(model: Any, cache: list[Any]) -> dict[int, tuple[nn.Module, _MixerTap]]:
    """A tap on the ``linear_attn`` of every layer whose cache is an ArraysCache (none if the layers do not line
    up with the cache, as in a pipelined model)."""
    layers = list(getattr(model, "layers", None) or [])
    if len(layers) != len(cache):
        return {}
    taps = {}
    for index, (layer, layer_cache) in enumerate(zip(layers, cache, strict=True)):
        mixer = getattr(layer, "linear_attn", None)
        if _is_state_arrays(layer_cache) and isinstance(mixer, nn.Module):
            mixer = mixer.mixer if isinstance(mixer, _MixerTap) else mixer  # a tap left by a failed verify
            layer.linear_attn = tap = _MixerTap(mixer)
            taps[index] = (layer, tap)
    return taps


def remove_taps(taps: dict[int, tuple[nn.Module, _MixerTap]]) -> dict[int, tuple[nn.Module, Any]]:
    """Put the tapped layers' mixers back; what each recorded, by layer index (layers that
    recorded nothing left out)."""
    recorded = {}
    for index, (layer, tap) in taps.items():
        layer.linear_attn = tap.mixer
        if tap.recorded is not None:
            recorded[index] = (tap.mixer, tap.recorded)
    return recorded


def _is_state_arrays(layer_cache: Any) -> bool:
    """A recurrent layer's state arrays: mlx-lm's ArraysCache, or a cache marked as one (mlx-vlm's own, which a
    vision-language model's Gated DeltaNet writes through its API: worker/vlm/model.py)."""
    return isinstance(layer_cache, ArraysCache) or getattr(layer_cache, "prefix_layer_kind", None) == "state"


def _snapshot(layer_cache: Any) -> tuple[str, Any]:
    if _is_state_arrays(layer_cache):
        # MLX arrays are immutable and the layers assign new ones, so the references are the snapshot.
        return "arrays", (list(layer_cache.cache), layer_cache.left_padding, layer_cache.lengths)
    if layer_cache.is_trimmable():
        return "offset", layer_cache.offset
    return "state", (layer_cache.state, layer_cache.meta_state)


def _restore(layer_cache: Any, saved: tuple[str, Any], *, keep: int = 0) -> None:
    """Back to the snapshot; a trimmable cache keeps ``keep`` of the tokens written since."""
    kind, value = saved
    if kind == "arrays":
        arrays, left_padding, lengths = value
        layer_cache.cache, layer_cache.left_padding, layer_cache.lengths = list(arrays), left_padding, lengths
    elif kind == "offset":
        layer_cache.trim(layer_cache.offset - value - keep)
    else:
        layer_cache.state, layer_cache.meta_state = value
