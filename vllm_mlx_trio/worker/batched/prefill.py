"""Prompt prefill driven by the batched runner itself, on the MLX thread, beside BatchGenerator.

mlx-lm's ``BatchGenerator`` prefills its prompts in the same ``next()`` as the decode step,
and every prompt step evaluates synchronously and then empties MLX's buffer cache
(``mx.clear_cache``): on a CPU that fixed cost made any step carrying a prompt chunk cost
several decode steps, however small the chunk. Here a prompt waits in :class:`PromptPrefill`
with its own cache (empty, or the prefix store's) and is prefilled one chunk per step, oldest
prompt first, one prompt at a time (on a CPU prefill time is linear in the tokens, so a prompt
alone finishes, and gets its first token, as early as it can). Only the streams that had their
first token before a prompt arrived (``NewSequence.protects``, from the scheduler) are protected
from it (the runner sizes its chunks by time for them); prompts that arrived together are
prefilled back to back in full chunks, as a batch would be, each one's first token as soon as
its own prompt is in (while more of the burst waits, its last chunk takes the last token too and
keeps that position's logits: worker/batched/prefill_burst.py). A burst's chunk is only queued
(``mx.async_eval``) on the generator's stream, so it runs while the loop hands the step's tokens
out; a timed chunk (beside protected
streams) runs alone before the plan's decode steps, once the work queued before it is done, so
its cost is measured (:attr:`PromptPrefill.last_chunk_s`) and the plan's run-ahead budget counts
only its decode steps. When all but a prompt's last token are in
its cache, the runner inserts it into the generator with that cache and the last token as a
one-token prompt, which mlx-lm moves straight to decoding: the generator's prompt path (and its
fixed cost) is never taken.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import KVCache, make_prompt_cache

from ..runner_base import LiveSequence
from ..speculative.hidden import final_norm_owner


class ChunkRecorder(Protocol):
    """Records a chunk's hidden states (worker/speculative/entry_hidden.py): a context manager around the chunk's
    forward
    of prompt positions ``first .. first + count - 1``, yielding the arrays to evaluate with its cache."""

    def chunk(
        self, request_id: Any, first: int, count: int, prompt_length: int
    ) -> contextlib.AbstractContextManager[list[mx.array]]: ...


class _LastPosition(nn.Module):
    """Stands in for the final norm: its output at the last position only."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def __call__(self, x: mx.array) -> mx.array:
        return self.norm(x)[:, -1:, :]


class _LastQueryOnly(nn.Module):
    """Stands in for the model's last decoder layer in a chunk that keeps only its last position's logits.

    Called on the chunk's positions but the last, then on the last: the first call's keys and values go into the
    layer's cache and its output is never used, so MLX never computes that layer's attention and MLP for those
    positions (a tenth of a 10-layer model's prefill); the second attends to them all, as a decode step does. On a
    cache other than :class:`KVCache`, or with a mask that is not causal, the layer runs whole (the final norm's
    output is cut to the last position all the same: :class:`_LastPosition`).
    """

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def __getattr__(self, name: str) -> Any:
        """The layer's own attributes (a model's forward may read them: ``use_sliding``, ``is_linear``)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "layer":
                raise
            return getattr(self.layer, name)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        masks = _split_masks(x, mask) if type(cache) is KVCache else None
        if masks is None:
            return self.layer(x, mask, cache)
        self.layer(x[:, :-1], masks[0], cache)  # the cache's keys and values; the output is dropped
        return self.layer(x[:, -1:], masks[1], cache)


def _split_masks(x: mx.array, mask: Any) -> tuple[Any, Any] | None:
    """A causal layer call's masks for its positions but the last, and for the last; None: it cannot be split."""
    if x.shape[1] < 2:
        return None
    if isinstance(mask, str) and mask == "causal":
        return "causal", None  # MLX's causal mask aligns the queries with the last keys
    if isinstance(mask, mx.array) and mask.ndim >= 2 and mask.shape[-2] == x.shape[1]:
        return mask[..., :-1, :-1], mask[..., -1:, :]
    return None


def _splittable(layer: Any) -> bool:
    """Whether a decoder layer is called as ``layer(x, mask, cache)`` and nothing else (a layer with more inputs may
    return more than its hidden states, or carry state between layers: it runs whole)."""
    try:
        params = list(inspect.signature(layer).parameters)
    except (TypeError, ValueError):
        return False
    return len(params) == 3 and params[1:] == ["mask", "cache"]


@attrs.define(slots=True, eq=False)
class PrefillRow:
    """A prompt being prefilled: its cache holds ``prompt[:done]``; the last token is left
    for the generator, whose first decode step reads it."""

    live: LiveSequence
    cache: list[Any]
    done: int
    #: Positions where the prefix store snapshots the sliding-window / recurrent layers
    #: (ascending, each below the last prompt token): a chunk never crosses one.
    boundaries: tuple[int, ...] = ()
    #: Set when the last chunk took the last prompt token too (``step(with_last=True)``): the
    #: logits ``(1, vocab)`` after it, from which the runner samples the first token itself.
    first_logits: mx.array | None = None

    def next_boundary(self) -> int | None:
        return next((b for b in self.boundaries if b > self.done), None)

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.live.seq.prompt_token_ids

    @property
    def left(self) -> int:
        """Tokens still to prefill (the last prompt token is not one of them)."""
        return len(self.prompt) - 1 - self.done


class PromptPrefill:
    """The prompts waiting for prefill, oldest first; one chunk of the oldest per step."""

    def __init__(self, model: Any, stream: mx.Stream, on_boundary: Callable[[Any, list[Any]], None] | None = None):
        self._model = model
        self._stream = stream
        #: Called with (request id, cache) when a row's cache stands at one of its boundaries.
        self._on_boundary = on_boundary
        self._rows: collections.deque[PrefillRow] = collections.deque()
        #: Seconds the last chunk run with ``wait`` took, alone on the stream.
        self.last_chunk_s = 0.0
        #: Set by a runner whose drafter needs the prompts' hidden states (the speculative runner, MTP).
        self.recorder: ChunkRecorder | None = None
        #: Whether a chunk can end with its last prompt token's logits (the model has a final norm to cut).
        self.gives_first_logits = _has_final_norm(model)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def tokens_left(self) -> int:
        return sum(row.left for row in self._rows)

    def add(self, live: LiveSequence, cache: list[Any] | None, boundaries: tuple[int, ...] = ()) -> PrefillRow:
        """Queue ``live`` (its first ``num_cached_tokens`` prompt tokens are in ``cache``)."""
        cache = cache if cache is not None else make_prompt_cache(self._model)
        row = PrefillRow(live, cache, live.seq.num_cached_tokens, boundaries)
        self._rows.append(row)
        return row

    def remove(self, rows: list[PrefillRow]) -> None:
        gone = {id(row) for row in rows}
        self._rows = collections.deque(row for row in self._rows if id(row) not in gone)

    @property
    def head(self) -> PrefillRow | None:
        """The prompt the next step prefills."""
        return self._rows[0] if self._rows else None

    @property
    def behind_head(self) -> list[PrefillRow]:
        """The prompts queued behind the oldest one."""
        return list(self._rows)[1:]

    def step(self, budget: int, *, wait: bool = False, with_last: bool = False) -> tuple[int, PrefillRow | None]:
        """Prefill up to ``budget`` tokens of the oldest prompt: (tokens prefilled, the row
        if its prompt is now in its cache, all but the last token; it leaves the queue).
        ``wait``: finish the work queued on the stream, then run the chunk alone and time it
        (:attr:`last_chunk_s`); else the chunk is only queued. ``with_last``: a chunk that
        ends the prompt takes its last token too, and keeps the logits after it
        (:attr:`PrefillRow.first_logits`; the cache then holds the whole prompt)."""
        if not self._rows or budget <= 0:
            return 0, None
        row = self._rows[0]
        n = min(budget, row.left)
        boundary = row.next_boundary()
        if boundary is not None:
            n = min(n, boundary - row.done)
        if with_last and n == row.left:  # boundaries lie before the last prompt token
            n += 1
        if n > 0:
            self._forward(row, n, wait=wait, keep_logits=n > row.left)
        if row.done == boundary and self._on_boundary is not None:
            self._on_boundary(row.live.request_id, row.cache)
        if row.left > 0:
            return n, None
        return n, self._rows.popleft()

    def _forward(self, row: PrefillRow, n: int, *, wait: bool, keep_logits: bool) -> None:
        """One chunk: the next ``n`` prompt tokens into the row's cache (timed alone if ``wait``)."""
        if wait:
            mx.synchronize(self._stream)
        started = time.perf_counter()
        with mx.stream(self._stream), self._recorded(row, n) as hidden, self._last_position_only(keep_logits):
            logits = self._model(mx.array([row.prompt[row.done : row.done + n]]), cache=row.cache)
            if keep_logits:
                row.first_logits = logits[:, -1, :]
        with mx.stream(self._stream):
            logits_out = [row.first_logits] if keep_logits else []
            (mx.eval if wait else mx.async_eval)([c.state for c in row.cache], hidden, logits_out)
        self.last_chunk_s = time.perf_counter() - started if wait else 0.0
        row.done += n

    @contextlib.contextmanager
    def _last_position_only(self, active: bool) -> Iterator[None]:
        """While active, the final norm's output is cut to the last position (:class:`_LastPosition`), so the
        output head runs there only, and the model's last decoder layer runs its attention and MLP there only too
        (:class:`_LastQueryOnly`) unless a recorder reads every position's hidden state or the layer takes more
        than ``(x, mask, cache)``: a chunk's logits cost about one position's, not the chunk's."""
        if not active:
            yield
            return
        owner = final_norm_owner(self._model)
        layers, norm = getattr(owner, "layers", None), owner.norm
        split = self.recorder is None and isinstance(layers, list) and bool(layers) and _splittable(layers[-1])
        last = layers[-1] if split else None  # a recorder reads every position's hidden state: no split then
        owner.norm = _LastPosition(norm)
        if split:
            layers[-1] = _LastQueryOnly(last)
        try:
            yield
        finally:
            owner.norm = norm
            if split:
                layers[-1] = last

    def _recorded(self, row: PrefillRow, n: int) -> contextlib.AbstractContextManager[list[mx.array]]:
        if self.recorder is None:
            return contextlib.nullcontext([])
        return self.recorder.chunk(row.live.request_id, row.done, n, len(row.prompt))


def _has_final_norm(model: Any) -> bool:
    try:
        final_norm_owner(model)
    except TypeError:
        return False
    return True
