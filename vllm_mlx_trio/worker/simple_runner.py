"""Simple mode on the MLX thread: one sequence at a time through mlx-lm's ``generate_step``.

``generate_step`` already overlaps the next token's compute (``mx.async_eval``) with the
host work on the current one, so a step here costs one forward pass of model time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from ..config import EngineConfig
from ..messages import KVReady, ModelInfo, NewSequence, RequestId, StepPlan, StepResult, TokenLogprob
from .kv_store import PrefixBlocks
from .loading import load_for_serving, mlx_memory
from .sampling import guard_processors, make_request_processors, make_request_sampler, token_logprob


class SimpleRunner:
    """Executes step plans; created and used only on the executor's thread."""

    #: Lock-step: ``generate_step`` already overlaps compute with the host work.
    plans_in_flight = 1
    max_tokens_per_step = 1

    @classmethod
    def max_running(cls, engine) -> int:
        return 1

    def __init__(self, cfg: EngineConfig):
        self._cfg = cfg
        self._model = None
        self._stream = None
        self._info: ModelInfo | None = None
        self._sequences: dict[RequestId, Iterator[tuple[int, mx.array]]] = {}
        self._num_logprobs: dict[RequestId, int] = {}
        #: Per live sequence: (its NewSequence, its KV cache, tokens emitted so far, the ids
        #: that end it).
        self._state: dict[RequestId, tuple[NewSequence, list, list[int], frozenset[int]]] = {}
        self._prefix: PrefixBlocks | None = None
        #: Requests whose own processing failed, with the cause.
        self._failures: dict[str, str] = {}

    def load(self) -> ModelInfo:
        self._model, self._info = load_for_serving(self._cfg.model, self._cfg.engine)
        self._stream = mx.new_stream(mx.default_device())
        self._prefix = PrefixBlocks(self._model, self._cfg.cache.block_size, enabled=self._cfg.cache.enabled)
        return self._info

    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        assert self._prefix is not None
        self._prefix.apply(plan)
        for request_id in plan.finished_ids:
            self._drop(request_id)
        kv_ready: list[KVReady | None] = []
        for seq in plan.new_seqs:
            self._sequences[seq.request_id] = self._start(seq)
            if seq.params.logprobs is not None:
                self._num_logprobs[seq.request_id] = seq.params.logprobs
        sampled, logprobs = [], []
        for rid in (*(s.request_id for s in plan.new_seqs), *plan.decode_ids):
            step = next(self._sequences[rid], None) if rid in self._sequences else None
            if rid in self._failures:  # its own processor failed: drop it, not its step's token
                self._drop(rid)
                continue
            if step is None:  # reached max_tokens; the scheduler has seen the last token
                continue
            token, row = int(step[0]), step[1]
            sampled.append((rid, (token,)))
            if rid in self._num_logprobs:
                logprobs.append((rid, (self._logprob(row, token, self._num_logprobs[rid]),)))
            seq, _cache, emitted, stop_ids = self._state[rid]
            if not emitted:
                kv_ready.append(self._prompt_ready(rid))
            emitted.append(token)
            if _finishes(seq, token, len(emitted), stop_ids):
                kv_ready.append(self._finished_ready(rid))
        failed = tuple((RequestId(rid), message) for rid, message in self._failures.items())
        self._failures.clear()
        return StepResult(
            step_id=plan.step_id,
            sampled=tuple(sampled),
            logprobs=tuple(logprobs),
            failed=failed,
            kv_ready=tuple(ready for ready in kv_ready if ready is not None),
            elapsed_s=time.perf_counter() - started,
            memory=mlx_memory(idle=not self.num_sequences),
        )

    def _prompt_ready(self, rid: RequestId) -> KVReady | None:
        assert self._prefix is not None
        seq, cache, _emitted, _stop_ids = self._state[rid]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        with mx.stream(self._stream):
            return self._prefix.ready(rid, seq.prompt_token_ids, cache, first_block)

    def _logprob(self, row: mx.array, token: int, num_top: int) -> TokenLogprob:
        with mx.stream(self._stream):
            return token_logprob(row, token, num_top)

    def _start(self, seq: NewSequence) -> Iterator[tuple[int, mx.array]]:
        assert self._info is not None and self._prefix is not None
        params = seq.params
        cache = self._prefix.cache_for(seq) or make_prompt_cache(self._model)
        stop_ids = params.stop_ids(self._info.eos_token_ids)
        self._state[seq.request_id] = (seq, cache, [], frozenset(stop_ids))
        return generate_step(
            mx.array(seq.prompt_token_ids[seq.num_cached_tokens :], dtype=mx.uint32),
            self._model,
            stream=self._stream,
            max_tokens=seq.max_new_tokens,
            sampler=make_request_sampler(params, self._info.vocab_size, seq.num_output_tokens),
            logits_processors=_with_prefix_context(
                guard_processors(
                    make_request_processors(params, stop_ids=stop_ids, generated=seq.output_token_ids),
                    seq.request_id,
                    self._failures,
                ),
                seq.prompt_token_ids[: seq.num_cached_tokens],
            ),
            prompt_cache=cache,
            prefill_step_size=self._cfg.engine.prefill_step_size,
        )

    def _finished_ready(self, rid: RequestId) -> KVReady | None:
        """The sequence's last token: offer its prompt + output blocks (``store_generated``)."""
        assert self._prefix is not None
        if not self._cfg.cache.store_generated:
            return None
        seq, cache, emitted, _stop_ids = self._state[rid]
        # The last token's KV is not computed yet: commit up to the one before it.
        token_ids = (*seq.prompt_token_ids, *emitted[:-1])
        first_block = len(seq.prompt_token_ids) // self._prefix.block_size
        with mx.stream(self._stream):
            return self._prefix.ready(rid, token_ids, cache, first_block)

    def _drop(self, request_id: RequestId) -> None:
        generator = self._sequences.pop(request_id, None)
        if generator is not None:
            generator.close()
        self._num_logprobs.pop(request_id, None)
        self._state.pop(request_id, None)

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def close(self) -> None:
        for generator in self._sequences.values():
            generator.close()
        self._sequences.clear()
        self._state.clear()
        if self._prefix is not None:
            self._prefix.close()
        self._model = None
        mx.clear_cache()


def _with_prefix_context(processors: list, cached_token_ids: tuple[int, ...]) -> list:
    """``generate_step`` gives processors only the tokens it was handed: put the cached
    prefix back in front, so a repetition penalty sees the whole prompt as without a hit."""
    if not processors or not cached_token_ids:
        return processors
    prefix = mx.array(cached_token_ids, dtype=mx.uint32)

    def wrap(processor):
        return lambda context, logits: processor(mx.concatenate([prefix, context.astype(mx.uint32)]), logits)

    return [wrap(processor) for processor in processors]


def _finishes(seq: NewSequence, token: int, num_emitted: int, stop_ids: frozenset[int]) -> bool:
    """Whether this token ends the sequence, by the rule the scheduler's Request applies
    (counting the tokens a preempted sequence produced before it was recomputed)."""
    num_output = seq.num_output_tokens + num_emitted
    stopped = token in stop_ids and num_output > seq.params.min_tokens
    return stopped or num_emitted >= seq.max_new_tokens
