"""Batched mode on the MLX thread: continuous batching through mlx-lm's ``BatchGenerator``.

Each step removes the sequences the scheduler dropped, inserts the new ones, and calls
``BatchGenerator.next()`` once: one decode step for every generating row (the next one is
already queued with ``mx.async_eval``) plus one chunk of the prompts being prefilled, so a
long prompt never freezes the other streams for long. The chunk is ``prefill_step_size`` when
no row decodes and ``prefill_step_size_decoding`` (smaller) while some do: mlx-lm reads the
generator's ``prefill_step_size`` at every ``next()``, so it is set before each step.

Every row carries its own sampler (its own PRNG key), logits processors, stop token ids and
max_tokens; the generator ends a row itself at max_tokens or a stop token, where the one
termination rule (core/termination.py, applied by :class:`RunnerBase`) ends it too.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from ..messages import KVReady, ModelInfo, RequestId, TokenLogprob
from .kv_store import PrefixBlocks
from .loading import load_for_serving, mlx_memory
from .runner_base import Advance, Emission, LiveSequence, RunnerBase
from .sampling import (
    greedy,
    guard_processors,
    make_request_processors,
    make_request_sampler,
    token_logprob,
)
from .thread_streams import enter_mlx_thread, leave_mlx_thread


class BatchRunner(RunnerBase):
    """Executes step plans on one shared batch; each live sequence's handle is its row's uid."""

    #: One plan queued so the MLX thread starts the next step without waiting for Trio.
    plans_in_flight = 2
    max_tokens_per_step = 1

    def __init__(self, cfg):
        super().__init__(cfg)
        self._generator: BatchGenerator | None = None
        self._request_ids: dict[int, RequestId] = {}  # BatchGenerator uid -> request
        self._decoding: set[int] = set()  # uids past their prompt: they decode every step

    def _load(self) -> ModelInfo:
        enter_mlx_thread()
        model, info = load_for_serving(self._cfg.model, self._cfg.engine)
        self._prefix = PrefixBlocks.from_config(model, self._cfg.cache)
        engine = self._cfg.engine
        self._generator = BatchGenerator(
            model,
            sampler=greedy,
            completion_batch_size=engine.completion_batch_size,
            prefill_batch_size=engine.prefill_batch_size,
            prefill_step_size=engine.prefill_step_size,
            stream=mx.new_stream(mx.default_device()),
        )
        return info

    def _insert(self, live: list[LiveSequence]) -> None:
        assert self._generator is not None
        seqs = [sequence.seq for sequence in live]
        rows = [self._row(sequence) for sequence in live]
        uids = self._generator.insert_segments(
            [self._prefix.prompt_segments(seq) for seq in seqs],  # prefill stops at each segment's end
            caches=[self._prefix.cache_for(seq) for seq in seqs],
            all_tokens=[list(seq.prompt_token_ids[: seq.num_cached_tokens]) for seq in seqs],
            max_tokens=[seq.max_new_tokens for seq in seqs],
            samplers=[row[0] for row in rows],
            logits_processors=[row[1] for row in rows],
            stop_sequences=[row[2] for row in rows],
        )
        for uid, sequence in zip(uids, live, strict=True):
            sequence.handle = uid
            self._request_ids[uid] = sequence.request_id

    def _row(self, live: LiveSequence) -> tuple:
        """(sampler, logits processors, stop sequences) for one new row: the stop ids are
        the termination rule's (min_tokens keeps them from being sampled early)."""
        assert self._info is not None
        seq, params = live.seq, live.seq.params
        stop_ids = tuple(sorted(live.termination.stop_ids))
        return (
            make_request_sampler(params, self._info.vocab_size, seq.num_output_tokens),
            guard_processors(
                make_request_processors(params, stop_ids=stop_ids, generated=seq.output_token_ids),
                seq.request_id,
                self.failures,
            ),
            StopSequences([[t] for t in stop_ids] or None),
        )

    def _advance(self, live: list[LiveSequence]) -> Advance:
        """One ``BatchGenerator.next()`` for the whole batch (``live`` is every row anyway)."""
        assert self._generator is not None
        self._generator.prefill_step_size = self._prefill_chunk()
        prompt_progress, generated = self._generator.next()
        self._decoding.update(r.uid for r in prompt_progress if r.end_of_prompt)
        # All but the last prompt token are in the cache (mlx-lm makes that token its own
        # segment): where the prefix store checkpoints a prompt. An earlier segment's end is a
        # block boundary where it snapshots the sliding-window / recurrent layers.
        ends = [r for r in prompt_progress if r.end_of_segment and not r.end_of_prompt]
        prompts_done = [self._request_ids[r.uid] for r in ends if r.progress[0] == r.progress[1] - 1]
        for r in ends:
            if r.progress[0] < r.progress[1] - 1:
                self._prefix.at_boundary(self._request_ids[r.uid], self._generator.extract_cache([r.uid])[r.uid][0])
        emissions = []
        for response in generated:
            ended = response.finish_reason is not None
            emissions.append(
                Emission(
                    self._request_ids[response.uid],
                    (response.token,),
                    (response.logprobs,),
                    ended=ended,
                    final=response if ended else None,
                )
            )
            if ended:  # the generator has let the row go
                del self._request_ids[response.uid]
                self._decoding.discard(response.uid)
        return Advance(emissions, prompts_done)

    def _prefill_chunk(self) -> int:
        """Prompt tokens per prefilling row in the next step: smaller while rows decode."""
        engine = self._cfg.engine
        if self._decoding and engine.prefill_step_size_decoding is not None:
            return min(engine.prefill_step_size, engine.prefill_step_size_decoding)
        return engine.prefill_step_size

    def _remove(self, live: list[LiveSequence]) -> None:
        assert self._generator is not None
        uids = [sequence.handle for sequence in live if sequence.handle in self._request_ids]
        if uids:
            self._generator.remove(uids)
        for uid in uids:
            del self._request_ids[uid]
            self._decoding.discard(uid)

    def _prompt_ready(self, live: LiveSequence) -> KVReady | None:
        """The prompt is processed: copy its new full blocks for the prefix store."""
        assert self._generator is not None
        if not self._prefix.enabled:
            return None
        seq = live.seq
        cache, _tokens = self._generator.extract_cache([live.handle])[live.handle]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        return self._prefix.ready(seq.request_id, seq.prompt_token_ids, cache, first_block)

    def _finished_ready(self, live: LiveSequence, emission: Emission) -> KVReady | None:
        """A sequence finished: its prompt + output blocks, for the next turn of a chat."""
        response = emission.final
        if not self._cfg.cache.store_generated or response is None or response.prompt_cache is None:
            return None
        first_block = len(live.seq.prompt_token_ids) // self._prefix.block_size
        return self._prefix.ready(live.request_id, tuple(response.all_tokens), response.prompt_cache, first_block)

    def _logprob(self, row: mx.array, token: int, num_top: int) -> TokenLogprob:
        return token_logprob(row, token, num_top)

    @property
    def compute_stream(self) -> mx.Stream | None:
        """The stream the model runs on (a distributed runner orders its collectives on it)."""
        return self._generator.stream if self._generator is not None else None

    def _memory(self, *, idle: bool) -> tuple[int, int, int]:
        return mlx_memory(idle=idle)

    def _close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        self._request_ids.clear()
        self._decoding.clear()
        mx.clear_cache()
        leave_mlx_thread()
