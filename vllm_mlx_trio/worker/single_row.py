"""One row alone decodes outside mlx-lm's batch machinery (batched mode, on the MLX thread).

While mlx-lm's ``BatchGenerator`` holds exactly one decoding row and nothing else (no prompt
in it, none queued), a step of that row costs more host time than ``generate_step``'s: the
row's ``BatchKVCache`` builds an attention mask and array offsets every forward pass, and the
generator's batch bookkeeping runs around it (on ``demo:tiny``, 1.5-1.8 ms of CPU a token
against 1.1-1.4 for the same step on a plain cache, docs/benchmarks.md). :class:`SingleRow` takes such a row
out of the generator: its cache becomes plain ``KVCache`` layers (what ``generate_step``
uses), and each step is the generation batch's own step for that one row (the same forward,
processors, sampler call, ``async_eval`` one token ahead, max_tokens and stop checks), so the
output is what the generator would give, token for token. The row keeps its uid.

The row goes back (its cache merged into a batch cache again) before anything else enters
the generator: the runner calls :meth:`SingleRow.give_back` before it inserts a row, and
:meth:`SingleRow.settle` gives it back if the generator holds anything at a step's start.

Like worker/generator_join.py, this reaches into mlx-lm 0.32.2's ``GenerationBatch`` (its
pending token and per-row state are not public), in this one place; the tests compare the
output with the generator's own, so a change there fails them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, GenerationBatch, _merge_caches
from mlx_lm.models.cache import BatchKVCache

#: MLX's buffer cache is emptied every this many one-row steps, as ``BatchGenerator`` does
#: every 512 generation steps (``generate_step`` every 256 tokens).
CLEAR_CACHE_EVERY = 512

Response = GenerationBatch.Response


class SingleRow:
    """The generator's one decoding row, stepped alone; holds at most that one row."""

    def __init__(self, generator: BatchGenerator, *, may_take: Callable[[], bool]):
        self._generator = generator
        #: Called before taking a row: False keeps it in the generator (e.g. a request waits to start).
        self._may_take = may_take
        #: The row's one-row generation batch (its per-row state), its ``prompt_cache`` left empty.
        self._batch: GenerationBatch | None = None
        #: The row's cache: plain layers, one per model layer.
        self._cache: list[Any] = []
        #: One-row steps taken so far.
        self.steps = 0

    @property
    def uid(self) -> int | None:
        """The uid of the row held, or None."""
        return self._batch.uids[0] if self._batch is not None else None

    def settle(self) -> bool:
        """Before a step: give the row back if the generator holds anything, or take the
        generator's one row if it is alone and may be taken; whether a row is held now."""
        if self._batch is not None:
            if not _empty(self._generator):
                self.give_back()
        elif self._takeable() and self._may_take():
            self._take()
        return self._batch is not None

    def _takeable(self) -> bool:
        generator = self._generator
        batch = generator._generation_batch
        return (
            len(batch) == 1
            and len(generator._prompt_batch) == 0
            and not generator._unprocessed_sequences
            and all(type(layer) is BatchKVCache for layer in batch.prompt_cache)
        )

    def _take(self) -> None:
        generator = self._generator
        batch = generator._generation_batch
        with mx.stream(generator.stream):
            self._cache = [layer.extract(0) for layer in batch.prompt_cache]
        batch.prompt_cache = []
        generator._generation_batch = GenerationBatch.empty(generator.model, generator.sampler)
        self._batch = batch

    def give_back(self) -> None:
        """Put the row held (if any) back into the generator's generation batch."""
        batch = self._batch
        if batch is None:
            return
        generator = self._generator
        with mx.stream(generator.stream):
            batch.prompt_cache = _merge_caches([self._cache])
        self._batch, self._cache = None, []
        if len(generator._generation_batch):
            generator._generation_batch.extend(batch)
        else:
            generator._generation_batch = batch

    def drop(self, uids: Sequence[int]) -> list[int]:
        """Let the row go if its uid is among ``uids``; the other uids."""
        held = self.uid
        if held is None or held not in uids:
            return list(uids)
        self._batch, self._cache = None, []
        return [uid for uid in uids if uid != held]

    def next(self) -> tuple[list, list[Response]]:
        """One step of the row held, as ``BatchGenerator.next()`` gives it: (no prompt
        progress, the row's response). A finished row is let go, with its cache."""
        batch = self._batch
        assert batch is not None, "settle() first"
        with mx.stream(self._generator.stream):
            token, logprobs = self._step(batch)
        self.steps += 1
        if self.steps % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()
        batch._num_tokens[0] += 1
        finish_reason = "length" if batch._num_tokens[0] >= batch.max_tokens[0] else None
        if batch._matchers[0].advance(token):
            finish_reason = "stop"
        if finish_reason is None:
            return [], [Response(batch.uids[0], token, logprobs, None, None, None)]
        response = Response(batch.uids[0], token, logprobs, finish_reason, self._cache, batch.tokens[0])
        self._batch, self._cache = None, []
        return [], [response]

    def _step(self, batch: GenerationBatch) -> tuple[int, mx.array]:
        """``GenerationBatch._step`` for its one row, on the plain cache: feed the pending
        token, queue the next one's sampling, then read the pending one."""
        inputs, logprobs_now = batch._next_tokens, batch._next_logprobs
        batch._current_tokens, batch._current_logprobs = inputs, logprobs_now
        logits = batch.model(inputs[:, None], cache=self._cache)[:, -1, :]
        context = []
        if processors := batch.logits_processors[0]:
            context.append(batch._token_context[0].update_and_fetch(inputs[0:1]))
            for processor in processors:
                logits = processor(context[0], logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampler = batch.samplers[0] if batch.samplers and batch.samplers[0] is not None else batch.fallback_sampler
        batch._next_tokens = sampler(logprobs)
        batch._next_logprobs = [logprobs[0]]
        mx.async_eval(batch._next_tokens, batch._next_logprobs, context)
        mx.eval(inputs, logprobs_now)
        token = inputs.item()
        batch.tokens[0].append(token)
        return token, logprobs_now[0]


def _empty(generator: BatchGenerator) -> bool:
    """Whether the generator holds no row at all (decoding, prefilling or queued)."""
    return not len(generator._generation_batch) and not len(generator._prompt_batch) and not (
        generator._unprocessed_sequences
    )
