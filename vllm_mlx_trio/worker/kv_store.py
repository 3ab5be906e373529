"""The prefix store's physical blocks, on the MLX thread: per-layer K/V arrays by block id.

The cache manager decides which blocks exist; this store only holds their arrays. A block
is ``block_size`` tokens of every layer's keys and values, copied out of a sequence's cache
when its prompt is done, and concatenated back into a fresh cache to start a sequence that
shares the prefix. Only models whose every layer is a plain ``KVCache`` can do this (sliding
windows and recurrent state cannot be cut into blocks): :func:`supports_prefix_blocks`.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..messages import BlockId, KVReady, NewSequence, RequestId, StepPlan

#: One block: (keys, values) per layer, each of shape (1, kv_heads, block_size, head_dim).
BlockArrays = list[tuple[mx.array, mx.array]]


def supports_prefix_blocks(model: Any) -> bool:
    """Whether the model's prompt cache is all plain KVCache layers."""
    return all(type(layer) is KVCache for layer in make_prompt_cache(model))


def cut_blocks(cache: list[Any], first_block: int, num_blocks: int, block_size: int) -> list[BlockArrays]:
    """Copies of blocks ``first_block ..`` of a single sequence's per-layer cache."""
    blocks = []
    for index in range(first_block, first_block + num_blocks):
        start, end = index * block_size, (index + 1) * block_size
        blocks.append(
            [
                (mx.contiguous(layer.keys[..., start:end, :]), mx.contiguous(layer.values[..., start:end, :]))
                for layer in cache
            ]
        )
    mx.eval([array for block in blocks for pair in block for array in pair])
    return blocks


def block_nbytes(block: BlockArrays) -> int:
    return sum(keys.nbytes + values.nbytes for keys, values in block)


class KVStore:
    """Block arrays by block id. Used only on the MLX thread."""

    def __init__(self) -> None:
        self._blocks: dict[BlockId, BlockArrays] = {}

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_id: object) -> bool:
        return block_id in self._blocks

    @property
    def nbytes(self) -> int:
        return sum(block_nbytes(block) for block in self._blocks.values())

    def put(self, block_id: BlockId, block: BlockArrays) -> None:
        self._blocks[block_id] = block

    def drop(self, block_ids: tuple[BlockId, ...]) -> None:
        for block_id in block_ids:
            self._blocks.pop(block_id, None)

    def build_cache(self, model: Any, block_ids: tuple[BlockId, ...]) -> list[KVCache]:
        """A fresh per-layer cache holding these blocks' tokens, in order."""
        cache = make_prompt_cache(model)
        blocks = [self._blocks[block_id] for block_id in block_ids]
        for layer_index, layer in enumerate(cache):
            keys = mx.concatenate([block[layer_index][0] for block in blocks], axis=2)
            values = mx.concatenate([block[layer_index][1] for block in blocks], axis=2)
            layer.state = (keys, values, keys.shape[2])
        return cache

    def clear(self) -> None:
        self._blocks.clear()


class PrefixBlocks:
    """A runner's side of the prefix cache: the store, plus the copies awaiting a verdict.

    When a sequence's KV is ready (prompt processed, or sequence finished) the runner copies
    its new full blocks and reports a :class:`KVReady`; the cache manager answers through a
    later plan (``store_blocks`` / ``released_ready_ids``), and the copies it did not keep
    are freed then.
    """

    def __init__(self, model: Any, block_size: int, *, enabled: bool):
        self.enabled = enabled and supports_prefix_blocks(model)
        self.block_size = block_size
        self.store = KVStore()
        self._model = model
        self._pending: dict[int, tuple[int, list[BlockArrays]]] = {}  # ready_id -> (first, copies)
        self._next_ready_id = 0

    def apply(self, plan: StepPlan) -> None:
        """Keep the copies the plan names, free the rest of their commits, drop evicted blocks."""
        for store in plan.store_blocks:
            first_block, copies = self._pending[store.ready_id]
            self.store.put(store.block_id, copies[store.block_index - first_block])
        for ready_id in plan.released_ready_ids:
            self._pending.pop(ready_id, None)
        self.store.drop(plan.drop_blocks)

    def cache_for(self, seq: NewSequence) -> list[Any] | None:
        """A cache holding the sequence's cached prefix blocks, or None when it has none."""
        if not seq.cached_block_ids:
            return None
        return self.store.build_cache(self._model, seq.cached_block_ids)

    def ready(
        self, request_id: RequestId, token_ids: tuple[int, ...], cache: list[Any], first_block: int
    ) -> KVReady | None:
        """Copy the full blocks of ``token_ids`` from ``first_block`` on out of ``cache``."""
        num_blocks = len(token_ids) // self.block_size - first_block
        if not self.enabled or num_blocks <= 0:
            return None
        copies = cut_blocks(cache, first_block, num_blocks, self.block_size)
        ready_id = self._next_ready_id
        self._next_ready_id += 1
        self._pending[ready_id] = (first_block, copies)
        return KVReady(
            request_id=request_id,
            ready_id=ready_id,
            token_ids=token_ids,
            first_block=first_block,
            block_nbytes=tuple(block_nbytes(copy) for copy in copies),
        )

    def close(self) -> None:
        self._pending.clear()
        self.store.clear()
