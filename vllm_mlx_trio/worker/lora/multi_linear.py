"""A linear layer that applies, row by row, one of several LoRA updates (or none).

Each adapted ``nn.Linear`` (or ``QuantizedLinear``) of the base model is replaced by a
:class:`MultiLoRALinear` holding every adapter's ``lora_a`` / ``lora_b`` stacked, slot 0 all zeros
("no adapter"), ranks zero-padded to the largest. Before each forward the runner sets the batch's
rows (:class:`AdapterRows`): one adapter slot per row. The update is mlx-lm's ``LoRALinear``'s,
``y = linear(x) + scale * ((x @ lora_a) @ lora_b)``, per row; a forward whose rows all use
no adapter runs the base linear alone, and one whose rows all use the same adapter runs that
adapter's matrices unbatched, as mlx-lm does; a mixed one gathers each row's matrices inside
its matmuls (``mx.gather_mm``).
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn


class AdapterRows:
    """The adapter slot of each row of the forward about to run (0: the base); shared by every
    :class:`MultiLoRALinear` of one model, set on the MLX thread only."""

    def __init__(self) -> None:
        self.slots: tuple[int, ...] = ()
        self._index: mx.array | None = None

    def set(self, slots: Sequence[int]) -> None:
        self.slots = tuple(slots)
        self._index = mx.array(self.slots, dtype=mx.uint32) if len(set(self.slots)) > 1 else None

    def clear(self) -> None:
        self.slots, self._index = (), None

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


class MultiLoRALinear(nn.Module):
    """``linear`` plus the LoRA update of each row's adapter (``lora_a``: (slots, in, rank),
    ``lora_b``: (slots, rank, out), ``scale``: (slots,); slot 0 is zeros)."""

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
        if slot is not None:
            z = (x @ self.lora_a[slot]) @ self.lora_b[slot]
            return y + (self.scale[slot] * z).astype(x.dtype)
        index = self._rows.index
        if x.ndim != 3 or x.shape[0] != index.shape[0]:
            raise ValueError(f"adapter rows: {index.shape[0]} rows set, forward of shape {x.shape}")
        # each row's matrices gathered inside the matmul (mx.gather_mm), never copied out
        z = mx.gather_mm(mx.gather_mm(x, self.lora_a, rhs_indices=index), self.lora_b, rhs_indices=index)
        return y + (self.scale[index][:, None, None] * z).astype(x.dtype)
