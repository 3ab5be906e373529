"""The target's hidden states of a sequence entering speculation from the batched path (the MTP head's context).

An MTP head drafts from the target's hidden state at the position before the pending token, and attends over the
pairs (hidden state at ``i``, token at ``i + 1``) of the positions before it: mlx-vlm and vLLM run the MTP layer
over the prompt's hidden states before the first draft. A sequence that enters speculation comes from the batched
path, whose forwards computed those hidden states and threw them away. :class:`EntryHidden` keeps the most recent
``limit`` of them per sequence (``speculative.mtp_context_tokens``), so the drafter starts with that context:

* a tap on the target's final norm records a forward's hidden states (references to arrays the forward computes);
* the runner's own prompt prefill (worker/batched/prefill.py) records each chunk through :meth:`EntryHidden.chunk`,
whose
  hidden states are then evaluated with the chunk's cache (a prefill forward reads no logits, so its final norm
  would not run otherwise); chunks wholly before the window are not recorded;
* a wrapper around ``BatchGenerator.next`` maps the forwards of one step to their rows: the generation batch's
  forward first, over the rows its responses name, in their order; then, if prompts finished this step, the new
  generation batch's forward over them (mlx-lm's own prompt path: their earlier positions are not recorded); a
  prompt forward of mlx-lm's is not kept.

A forward whose batch size does not match its rows drops those rows' records (a position would be missing), and a
prefix-cache hit's cached positions have none: the context then starts later. A missing or short context only
lowers acceptance; the target verifies every draft. Records are per request and dropped when it leaves. Memory: up
to ``limit`` hidden states per sequence (``hidden_size`` values each). MLX thread only.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ...messages import RequestId
from .hidden import PRE_NORM, final_norm_owner


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

    @contextlib.contextmanager
    def recorded(self) -> Iterator[list[mx.array]]:
        """Record the calls inside the block into the list it yields."""
        self.recording, self.calls = True, []
        try:
            yield self.calls
        finally:
            self.recording = False
            self.calls = []


class _History:
    """One sequence's recorded hidden states, oldest first, contiguous: segments ``(hidden, row, first, count)``
    standing for ``hidden[row, first:first + count]``; at most ``limit`` positions beyond the oldest segment."""

    def __init__(self, limit: int):
        self._limit = limit
        self._segments: collections.deque[tuple[mx.array, int, int, int]] = collections.deque()
        self.length = 0

    def add(self, hidden: mx.array, row: int, first: int, count: int) -> None:
        self._segments.append((hidden, row, first, count))
        self.length += count
        while self.length - self._segments[0][3] >= self._limit:
            self.length -= self._segments.popleft()[3]

    def gather(self) -> mx.array:
        """The recorded hidden states ``(1, n, hidden_size)``, the last ``limit`` positions."""
        parts = [hidden[row : row + 1, first : first + count] for hidden, row, first, count in self._segments]
        joined = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=1)
        return joined[:, -self._limit :]


class EntryHidden:
    """Per sequence on the batched path, the target's hidden states of its last ``limit`` positions."""

    def __init__(self, model: Any, generator: Any, mode: str, *, limit: int, request_of: Mapping[int, RequestId]):
        self._owner = final_norm_owner(model)
        self._tap = _RecordingNorm(self._owner.norm, mode)
        self._owner.norm = self._tap
        self._generator = generator
        self._next = generator.next
        generator.next = self._recorded_next
        self._limit = limit
        #: The runner's generator uid -> request map (read when a step's forwards are mapped to rows).
        self._request_of = request_of
        self._histories: dict[RequestId, _History] = {}

    @property
    def num_tracked(self) -> int:
        """Sequences with recorded hidden states (for tests: nothing is left behind)."""
        return len(self._histories)

    def take(self, request_id: RequestId) -> mx.array | None:
        """The hidden states ``(1, n, hidden_size)`` of the sequence's last ``n <= limit`` positions, the last one
        before its pending token; None if none was recorded. The record is dropped."""
        history = self._histories.pop(request_id, None)
        return None if history is None else history.gather()

    def forget(self, request_id: RequestId) -> None:
        self._histories.pop(request_id, None)

    @contextlib.contextmanager
    def chunk(self, request_id: RequestId, first: int, count: int, prompt_length: int) -> Iterator[list[mx.array]]:
        """Around a prefill forward of prompt positions ``first .. first + count - 1`` of one sequence: records its
        hidden states if they may be in the window; yields the arrays to evaluate with the chunk's cache."""
        if first + count <= prompt_length - self._limit:  # wholly before the window: the final norm stays unrun
            yield []
            return
        with self._tap.recorded() as calls:
            kept: list[mx.array] = []
            yield kept
            if len(calls) == 1 and calls[0].shape[:2] == (1, count):
                if first == 0 or request_id not in self._histories:
                    self._histories[request_id] = _History(self._limit)
                self._histories[request_id].add(calls[0], 0, 0, count)
                kept.append(calls[0])
            else:
                self.forget(request_id)

    def close(self) -> None:
        """Put the target's norm and the generator's ``next`` back."""
        if self._owner.norm is self._tap:
            self._owner.norm = self._tap.norm
        self._generator.next = self._next
        self._histories.clear()

    def _recorded_next(self) -> tuple[list, list]:
        with self._tap.recorded() as calls:
            prompt_progress, generated = self._next()
        index = 0
        if generated:
            self._record(calls, index, [r.uid for r in generated])
            for response in generated:
                if response.finish_reason is not None:
                    self.forget(self._request_of.get(response.uid))
            index += 1
        started = [r.uid for r in prompt_progress if r.end_of_prompt]
        if started:
            for uid in started:  # mlx-lm's prompt path: the context starts at the prompt's last token
                self.forget(self._request_of.get(uid))
            self._record(calls, index, started)
        return prompt_progress, generated

    def _record(self, calls: list[mx.array], index: int, uids: list[int]) -> None:
        """Forward ``index`` of this step ran over the rows ``uids``: one position more for each."""
        requests = [self._request_of.get(uid) for uid in uids]
        if index >= len(calls) or calls[index].shape[0] != len(uids):
            for request_id in requests:
                self.forget(request_id)
            return
        hidden = calls[index]
        for row, request_id in enumerate(requests):
            if request_id is None:
                continue
            history = self._histories.get(request_id)
            if history is None:
                history = self._histories[request_id] = _History(self._limit)
            history.add(hidden, row, hidden.shape[1] - 1, 1)
