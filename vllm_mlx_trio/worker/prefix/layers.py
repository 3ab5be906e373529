"""What the prefix cache copies out of, and back into, each kind of mlx-lm cache layer.

Three kinds of layer can be cached, each by what a hit needs to continue exactly as a fresh
prefill would:

- ``kv`` (``KVCache``, MLA's latent cache included): the keys and values of every token, so
  they are cut into blocks of ``block_size`` tokens, shared by every prompt with that prefix;
  a checkpoint adds the tokens after the last full block (its tail).
- ``window`` (``RotatingKVCache``, sliding-window attention, ``keep == 0``): attention past a
  position sees only the last ``max_size`` tokens before it, and a fresh cache never keeps more
  for the steps after (``_update_concat`` trims to ``max_size - 1``, a batch merge keeps
  ``max_size``), so a checkpoint keeps exactly those, in temporal order, with the offset.
- ``state`` (``ArraysCache``/``MambaCache``: linear attention, SSM, conv): the state after
  token n is the whole history, so a checkpoint keeps a snapshot of its arrays, taken only
  where the cache is exactly at the checkpoint's position. Such a layer does not say how many
  tokens it has seen: a model with no attention layer (mamba, mamba2) has no cache position
  (:meth:`CacheLayout.position` is None), and is checkpointed only where the runner or the
  store knows the position (``PrefixBlocks``).

A model with another layer type (quantized KV, chunked, cache lists...) is not cached at all:
:func:`cache_layout` says which types, and the runner serves it uncached.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache, make_prompt_cache

LayerKind = Literal["kv", "window", "state"]


@attrs.frozen(slots=True)
class Packed:
    """An array kept quantized (``cache.kv_bits``): mx.quantize over its values flattened
    per head, so any head size packs into groups of ``group_size``."""

    weights: mx.array
    scales: mx.array
    biases: mx.array | None
    shape: tuple[int, ...]
    dtype: mx.Dtype
    group_size: int
    bits: int

    @classmethod
    def of(cls, array: mx.array, group_size: int, bits: int) -> Packed:
        flat = array.reshape(*array.shape[:-2], -1)
        weights, scales, *biases = mx.quantize(flat, group_size=group_size, bits=bits)
        return cls(weights, scales, biases[0] if biases else None, tuple(array.shape), array.dtype, group_size, bits)

    def unpack(self) -> mx.array:
        flat = mx.dequantize(self.weights, self.scales, self.biases, group_size=self.group_size, bits=self.bits)
        return flat.reshape(self.shape).astype(self.dtype)

    def __iter__(self):  # the arrays it holds, for byte counts and evaluation
        return iter([a for a in (self.weights, self.scales, self.biases) if a is not None])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self)


Stored = mx.array | Packed

#: One full block: (keys, values) of each ``kv`` layer, in layer order; (1, heads, block_size,
#: dim) each, or :class:`Packed` when stored quantized.
BlockArrays = list[tuple[Stored, Stored]]


def nbytes_of(stored: Stored) -> int:
    return stored.nbytes


def unpack(stored: Stored) -> mx.array:
    return stored.unpack() if isinstance(stored, Packed) else stored


@attrs.frozen(slots=True, kw_only=True)
class Checkpoint:
    """The non-block part of a cache at ``num_tokens`` tokens: per layer, a ``kv`` layer's tail
    (keys, values) after the last full block (None if empty), a ``window`` layer's last tokens
    (keys, values), or a ``state`` layer's arrays."""

    num_tokens: int
    layers: tuple[Any, ...]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for layer in self.layers if layer is not None for a in _arrays(layer))


def _arrays(layer: Any) -> list[mx.array]:
    return [a for a in layer if a is not None]


def _kind(layer: Any) -> LayerKind | None:
    if type(layer) is KVCache or getattr(layer, "prefix_layer_kind", None) == "kv":  # a KVCache subclass
        return "kv"
    if type(layer) is RotatingKVCache and layer.keep == 0:
        return "window"
    if isinstance(layer, ArraysCache) or getattr(layer, "prefix_layer_kind", None) == "state":
        return "state"  # the second: mlx-vlm's own recurrent-state cache (its Qwen3.5)
    return None


def cache_layout(model: Any, *, kv_bits: int | None = None, kv_group_size: int = 64) -> CacheLayout:
    """The model's layer kinds, or the names of the layer types that cannot be cached."""
    layers = make_prompt_cache(model)
    kinds = tuple(_kind(layer) for layer in layers)
    unsupported = sorted({type(layer).__name__ for layer, kind in zip(layers, kinds, strict=True) if kind is None})
    if not kinds:
        unsupported.append("no cache layers")
    return CacheLayout(
        kinds=kinds if not unsupported else (),
        unsupported=tuple(unsupported),
        kv_bits=kv_bits,
        kv_group_size=kv_group_size,
    )


@attrs.frozen(slots=True, kw_only=True)
class CacheLayout:
    """How a model's per-layer cache is cut into blocks and checkpoints."""

    kinds: tuple[LayerKind, ...]
    unsupported: tuple[str, ...] = ()
    #: Store full blocks quantized to this many bits (None: as computed), in groups of this size.
    kv_bits: int | None = None
    kv_group_size: int = 64

    @property
    def cachable(self) -> bool:
        return not self.unsupported

    @property
    def blocks_end_hits(self) -> bool:
        """Whether a hit may end at any full block (every layer is plain KV)."""
        return all(kind == "kv" for kind in self.kinds)

    @property
    def knows_position(self) -> bool:
        """Whether a cache tells how many tokens it holds (it has an attention layer)."""
        return any(kind != "state" for kind in self.kinds)

    def position(self, cache: list[Any]) -> int | None:
        """How many tokens the cache holds (its attention layers agree on it); None for a
        model with recurrent layers only, whose state does not say."""
        if not self.knows_position:
            return None
        offsets = {layer.offset for layer, kind in zip(cache, self.kinds, strict=True) if kind != "state"}
        assert len(offsets) == 1, f"the layers disagree on the cache's position: {offsets}"
        return offsets.pop()

    def cut_blocks(self, cache: list[Any], first_block: int, num_blocks: int, block_size: int) -> list[BlockArrays]:
        """Copies of the ``kv`` layers' blocks ``first_block ..`` of a single sequence's cache."""
        kv = [layer for layer, kind in zip(cache, self.kinds, strict=True) if kind == "kv"]
        blocks = [
            [self._pack(_copy_range(layer, index * block_size, (index + 1) * block_size)) for layer in kv]
            for index in range(first_block, first_block + num_blocks)
        ]
        mx.eval([array for block in blocks for pair in block for stored in pair for array in _leaves(stored)])
        return blocks

    def _pack(self, pair: tuple[mx.array, mx.array]) -> tuple[Stored, Stored]:
        """A block's (keys, values), quantized when ``kv_bits`` is set and the group size
        divides a head's values (else kept as computed)."""
        keys, values = pair
        if self.kv_bits is None or any(a.shape[-2] * a.shape[-1] % self.kv_group_size for a in pair):
            return keys, values
        return Packed.of(keys, self.kv_group_size, self.kv_bits), Packed.of(values, self.kv_group_size, self.kv_bits)

    def checkpoint(self, cache: list[Any], num_tokens: int, block_size: int) -> Checkpoint:
        """A copy of the cache's non-block part at ``num_tokens``, where the cache must be
        unless every layer is ``kv`` (a ``kv`` tail can be cut from a longer cache)."""
        tail_start = num_tokens // block_size * block_size
        layers: list[Any] = []
        for layer, kind in zip(cache, self.kinds, strict=True):
            if kind == "kv":
                empty = tail_start == num_tokens
                layers.append(None if empty else _copy_range(layer, tail_start, num_tokens))
            elif kind == "window":
                assert layer.offset == num_tokens, "a window is checkpointed where it is"
                keys = layer._temporal_order(layer.keys)[..., -min(num_tokens, layer.max_size) :, :]
                values = layer._temporal_order(layer.values)[..., -min(num_tokens, layer.max_size) :, :]
                layers.append((mx.contiguous(keys), mx.contiguous(values)))
            else:
                layers.append(tuple(None if a is None else mx.contiguous(a) for a in layer.cache))
        checkpoint = Checkpoint(num_tokens=num_tokens, layers=tuple(layers))
        mx.eval([a for layer in checkpoint.layers if layer is not None for a in _arrays(layer)])
        return checkpoint

    def build(self, model: Any, blocks: list[BlockArrays], checkpoint: Checkpoint | None, num_tokens: int) -> list[Any]:
        """A fresh per-layer cache holding ``num_tokens`` tokens: the blocks, then the checkpoint."""
        cache = make_prompt_cache(model)
        kv_index = 0
        for layer_index, (layer, kind) in enumerate(zip(cache, self.kinds, strict=True)):
            saved = checkpoint.layers[layer_index] if checkpoint is not None else None
            if kind == "kv":
                parts = [tuple(map(unpack, block[kv_index])) for block in blocks]
                parts += [saved] if saved is not None else []
                kv_index += 1
                # a hit may end inside its last entry: a KV prefix of any length is exact
                keys = mx.concatenate([k for k, _ in parts], axis=2)[..., :num_tokens, :]
                values = mx.concatenate([v for _, v in parts], axis=2)[..., :num_tokens, :]
                layer.state = (keys, values, keys.shape[2])
                assert layer.offset == num_tokens
            elif kind == "window":
                assert checkpoint is not None, "a window layer is restored from a checkpoint"
                keys, values = mx.array(saved[0]), mx.array(saved[1])  # new arrays: updates stay ours
                layer.keys, layer.values = keys, values
                layer.offset, layer._idx = num_tokens, keys.shape[2]
            else:
                assert checkpoint is not None, "a state layer is restored from a checkpoint"
                layer.cache = [None if a is None else mx.array(a) for a in saved]
        return cache


def _leaves(stored: Stored) -> list[mx.array]:
    return list(stored) if isinstance(stored, Packed) else [stored]


def _copy_range(layer: KVCache, start: int, end: int) -> tuple[mx.array, mx.array]:
    return mx.contiguous(layer.keys[..., start:end, :]), mx.contiguous(layer.values[..., start:end, :])
