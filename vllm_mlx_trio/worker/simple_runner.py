"""Simple mode on the MLX thread: one sequence at a time through mlx-lm's ``generate_step``.

``generate_step`` already overlaps the next token's compute (``mx.async_eval``) with the
host work on the current one, so a step here costs one forward pass of model time. The
bookkeeping (finish, logprobs, failures, the step's result) is :class:`RunnerBase`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from ..messages import KVReady, ModelInfo, TokenLogprob
from ..runner_kinds import SIMPLE
from .loading import load_for_serving, mlx_memory
from .prefix.kv_store import PrefixBlocks
from .runner_base import Advance, Emission, LiveSequence, RunnerBase
from .sampling import guard_processors, make_request_processors, make_request_sampler, token_logprobs
from .thread_streams import enter_mlx_thread, leave_mlx_thread


class SimpleRunner(RunnerBase):
    """Each live sequence's handle is (its ``generate_step`` generator, its KV cache)."""

    kind = SIMPLE

    #: Lock-step: ``generate_step`` already overlaps compute with the host work.
    plans_in_flight = 1
    max_tokens_per_step = 1

    @classmethod
    def max_running(cls, engine) -> int:
        return 1

    def _load(self) -> ModelInfo:
        enter_mlx_thread()
        self._model, info = load_for_serving(self._cfg.model, self._cfg.engine)
        self._stream = mx.new_stream(mx.default_device())
        self._prefix = PrefixBlocks.from_config(self._model, self._cfg.cache)
        return info

    def _insert(self, live: list[LiveSequence]) -> None:
        assert self._info is not None
        for sequence in live:
            seq, params = sequence.seq, sequence.seq.params
            cache = self._prefix.cache_for(seq) or make_prompt_cache(self._model)
            with mx.stream(self._stream):  # up to the last block boundary the store snapshots at
                start = self._prefix.prefill_to_boundaries(seq, cache, self._cfg.engine.prefill_step_size)
            checkpoints: list = []  # the prefix store's, taken before the last prompt token
            stop_ids = params.stop_ids(self._info.eos_token_ids)
            generator = generate_step(
                mx.array(seq.prompt_token_ids[start:], dtype=mx.uint32),
                self._model,
                stream=self._stream,
                max_tokens=seq.max_new_tokens,
                sampler=make_request_sampler(params, self._info.vocab_size, seq.num_output_tokens),
                logits_processors=_with_prefix_context(
                    guard_processors(
                        make_request_processors(params, stop_ids=stop_ids, generated=seq.output_token_ids),
                        seq.request_id,
                        self.failures,
                    ),
                    seq.prompt_token_ids[:start],
                ),
                prompt_cache=cache,
                prefill_step_size=self._cfg.engine.prefill_step_size,
                prompt_progress_callback=self._checkpointer(start, cache, checkpoints),
            )
            sequence.handle = (generator, cache, checkpoints)

    def _advance(self, live: list[LiveSequence]) -> Advance:
        emissions, prompts_done = [], []
        for sequence in live:
            step = next(sequence.handle[0], None)
            if step is None:  # generate_step reached max_tokens: the rule finished it already
                continue
            token, row = int(step[0]), step[1]
            if not sequence.emitted:
                prompts_done.append(sequence.request_id)
            emissions.append(Emission(sequence.request_id, (token,), (row,)))
        return Advance(emissions, prompts_done)

    def _remove(self, live: list[LiveSequence]) -> None:
        for sequence in live:
            sequence.handle[0].close()

    def _checkpointer(self, start: int, cache, checkpoints: list):
        """A progress callback that snapshots the cache once all but the last prompt token are
        in it, for models whose sliding-window or recurrent layers the store must catch there."""
        if not self._prefix.needs_exact_checkpoints:
            return None

        def on_progress(done: int, total: int) -> None:
            if done == total - 1 and done > 0:
                checkpoints.append(self._prefix.snapshot(cache, start + done))

        return on_progress

    def _prompt_ready(self, live: LiveSequence) -> KVReady | None:
        seq, cache, checkpoints = live.seq, live.handle[1], live.handle[2]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        with mx.stream(self._stream):
            checkpoint = checkpoints.pop() if checkpoints else None
            return self._prefix.ready(seq.request_id, seq.prompt_token_ids, cache, first_block, checkpoint)

    def _finished_ready(self, live: LiveSequence, emission: Emission) -> KVReady | None:
        """The sequence's last token: offer its prompt + output blocks (``store_generated``)."""
        if not self._cfg.cache.store_generated:
            return None
        seq, cache = live.seq, live.handle[1]
        # generate_step has run the last token through the model too (it computes one ahead);
        # the store keeps only what the cache holds.
        token_ids = (*seq.prompt_token_ids, *live.emitted)
        first_block = len(seq.prompt_token_ids) // self._prefix.block_size
        with mx.stream(self._stream):
            return self._prefix.ready(seq.request_id, token_ids, cache, first_block)

    def _logprobs(self, rows: Sequence[mx.array], tokens: Sequence[int], num_tops: Sequence[int]) -> list[TokenLogprob]:
        with mx.stream(self._stream):
            return token_logprobs(rows, tokens, num_tops)

    def _memory(self, *, idle: bool) -> tuple[int, int, int]:
        return mlx_memory(idle=idle)

    def _close(self) -> None:
        self._model = None
        mx.clear_cache()
        leave_mlx_thread()


def _with_prefix_context(processors: list, cached_token_ids: tuple[int, ...]) -> list:
    """``generate_step`` gives processors only the tokens it was handed: put the cached
    prefix back in front, so a repetition penalty sees the whole prompt as without a hit."""
    if not processors or not cached_token_ids:
        return processors
    prefix = mx.array(cached_token_ids, dtype=mx.uint32)

    def wrap(processor):
        return lambda context, logits: processor(mx.concatenate([prefix, context.astype(mx.uint32)]), logits)

    return [wrap(processor) for processor in processors]
