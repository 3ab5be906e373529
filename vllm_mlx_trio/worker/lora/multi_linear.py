"""A linear layer that applies, row by row, one of several LoRA updates (or none).

Each adapted ``nn.Linear`` (or ``QuantizedLinear``) of the base model is replaced by a
:class:`MultiLoRALinear` holding every adapter's ``lora_a`` side by side in one matrix
(in, slots * rank) and every ``lora_b`` stacked in another (slots * rank, out): slot 0 all
zeros ("no adapter"), every rank zero-padded to the largest. Before each forward the runner
sets the batch's rows (:class:`AdapterRows`): one adapter slot per row. The update is mlx-lm's
``LoRALinear``'s, ``y = linear(x) + scale * ((x @ lora_a) @ lora_b)``, per row. A forward whose
rows all use no adapter runs the base linear alone; one whose rows all use the same adapter runs
that adapter's columns and rows alone, as mlx-lm does; a mixed one runs ``x`` through every
adapter's ``lora_a`` at once, zeroes each row's columns of the adapters it does not use (one
mask per forward, shared by every layer), and then through every ``lora_b``: two plain matmuls
however many adapters the batch mixes (per-row gathered matmuls cost far more on a CPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn


class AdapterRows:
    """The adapter slot of each row of the forward about to run (0: the base); shared by every
    :class:`MultiLoRALinear` of one model (all with ``rank`` columns a slot), set on the MLX thread only."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.slots: tuple[int, ...] = ()
        self._index: mx.array | None = None
        self._masks: dict[tuple[mx.Dtype, int], mx.array] = {}

    def set(self, slots: Sequence[int]) -> None:
        self.slots = tuple(slots)
        self._index = mx.array(self.slots, dtype=mx.uint32) if len(set(self.slots)) > 1 else None
        self._masks = {}

    def clear(self) -> None:
        self.slots, self._index, self._masks = (), None, {}

    @property
    def uniform(self) -> int | None:
        """The one slot every row uses (0 when no rows are set), or None when they differ."""
        if not self.slots:
            return 0
        return self.slots[0] if self._index is None else None

    @property
    def index(self) -> mx.array:
        assert self._index is not None
        return self._index

    def mask(self, dtype: mx.Dtype, columns: int) -> mx.array:
        """(rows, 1, columns): 1 on each row's own slot's columns, 0 elsewhere."""
        key = (dtype, columns)
        if key not in self._masks:
            owner = mx.arange(columns) // self.rank
            self._masks[key] = (owner[None, :] == self.index[:, None]).astype(dtype)[:, None, :]
        return self._masks[key]

    def scales(self, scale: mx.array) -> mx.array:
        """(rows, 1, 1): each row's adapter's scale."""
        return scale[self.index][:, None, None]


class MultiLoRALinear(nn.Module):
    """``linear`` plus the LoRA update of each row's adapter (``lora_a``: (in, slots * rank),
    ``lora_b``: (slots * rank, out), ``scale``: (slots,); slot 0 is zeros)."""

    def __init__(self, linear: nn.Module, lora_a: mx.array, lora_b: mx.array, scale: mx.array, rows: AdapterRows):
        super().__init__()
        self.linear = linear
        self.lora_a = lora_a
        self.lora_b = lora_b
        self.scale = scale
        self._rows = rows

    def __call__(self, x: mx.array) -> mx.array:
        y = self.linear(x)
        slot = self._rows.uniform
        if slot == 0:
            return y
        rank = self._rows.rank
        if slot is not None:
            columns = slice(slot * rank, (slot + 1) * rank)
            z = (x @ self.lora_a[:, columns]) @ self.lora_b[columns]
            return y + (self.scale[slot] * z).astype(x.dtype)
        if x.ndim != 3 or x.shape[0] != len(self._rows.slots):
            raise ValueError(f"adapter rows: {len(self._rows.slots)} rows set, forward of shape {x.shape}")
        z = ((x @ self.lora_a) * self._rows.mask(x.dtype, self.lora_a.shape[1])) @ self.lora_b
        return y + (self._rows.scales(self.scale) * z).astype(x.dtype)
