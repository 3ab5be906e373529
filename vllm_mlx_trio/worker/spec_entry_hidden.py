"""The target's hidden state for a sequence entering speculation from the batched path (MTP's first round).

An MTP head drafts from the target's hidden state at the position before the pending token. A sequence that enters
speculation comes from mlx-lm's ``BatchGenerator``, whose last forward over that sequence already computed that hidden
state (it produced the pending token's logits) and threw it away. :class:`EntryHidden` keeps it: a tap on the
target's final norm records every forward's hidden states (references to arrays the forward computes anyway), and a
wrapper around ``BatchGenerator.next`` maps the forwards of one step to their rows:

* the generation batch's forward runs first, over the rows its responses name, in their order;
* then, if prompts finished this step, the new generation batch's forward over them, in the order of their
  end-of-prompt progress responses;
* then, if prompts are still being processed, a prompt forward (not kept: no row of it has a pending token).

A forward whose batch size does not match its rows is skipped, and a row without a recorded state enters without
one (the drafter then drafts from its first settle): a missing or wrong hidden state only lowers acceptance, the
target verifies every draft. MLX thread only.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .spec_hidden import PRE_NORM, final_norm_owner


class _RecordingNorm(nn.Module):
    """Stands in for the target's final norm; while ``recording``, keeps each call's input or output (by ``mode``)."""

    def __init__(self, norm: nn.Module, mode: str):
        super().__init__()
        self.norm = norm
        self.mode = mode
        self.recording = False
        self.calls: list[mx.array] = []

    def __call__(self, x: mx.array) -> mx.array:
        out = self.norm(x)
        if self.recording:
            self.calls.append(x if self.mode == PRE_NORM else out)
        return out


class EntryHidden:
    """Per decoding row of a ``BatchGenerator``, the target's hidden state that produced its pending token."""

    def __init__(self, model: Any, generator: Any, mode: str):
        self._owner = final_norm_owner(model)
        self._tap = _RecordingNorm(self._owner.norm, mode)
        self._owner.norm = self._tap
        self._generator = generator
        self._next = generator.next
        generator.next = self._recorded_next
        #: uid -> (the forward's hidden states, the uid's row in them): sliced only by :meth:`take`, so a step
        #: of the batched path builds no array for rows that never enter speculation.
        self._by_uid: dict[int, tuple[mx.array, int]] = {}

    def take(self, uid: int) -> mx.array | None:
        """The hidden state ``(1, 1, hidden_size)`` before ``uid``'s pending token, or None if none was recorded."""
        recorded = self._by_uid.pop(uid, None)
        if recorded is None:
            return None
        hidden, row = recorded
        return hidden[row : row + 1, -1:]

    def close(self) -> None:
        """Put the target's norm and the generator's ``next`` back."""
        if self._owner.norm is self._tap:
            self._owner.norm = self._tap.norm
        self._generator.next = self._next
        self._by_uid.clear()

    def _recorded_next(self) -> tuple[list, list]:
        self._tap.recording = True
        try:
            prompt_progress, generated = self._next()
        finally:
            self._tap.recording = False
            calls, self._tap.calls = self._tap.calls, []
        by_uid: dict[int, tuple[mx.array, int]] = {}
        index = 0
        if generated:
            self._keep(by_uid, calls, index, [r.uid for r in generated if r.finish_reason is None],
                       [r.uid for r in generated])  # fmt: skip
            index += 1
        started = [r.uid for r in prompt_progress if r.end_of_prompt]
        if started:
            self._keep(by_uid, calls, index, started, started)
        self._by_uid = by_uid
        return prompt_progress, generated

    @staticmethod
    def _keep(by_uid: dict[int, tuple[mx.array, int]], calls: list[mx.array], index: int, keep: list[int],
              rows: list[int]):  # fmt: skip
        """Record where row ``uid``'s hidden states are in forward ``index`` (whose batch is ``rows``), for the uids
        in keep."""
        if index >= len(calls) or calls[index].shape[0] != len(rows):
            return
        hidden = calls[index]
        for row, uid in enumerate(rows):
            if uid in keep:
                by_uid[uid] = (hidden, row)
