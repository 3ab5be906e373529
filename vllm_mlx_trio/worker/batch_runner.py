"""Batched mode on the MLX thread: continuous batching through mlx-lm's ``BatchGenerator``.

Each step removes the sequences the scheduler dropped, inserts the new ones, and calls
``BatchGenerator.next()`` once: one decode step for every generating row (the next one is
already queued with ``mx.async_eval``) plus one ``prefill_step_size`` chunk of the prompts
being prefilled, so a long prompt never freezes the other streams for long.

Every row carries its own sampler (its own PRNG key), logits processors, stop token ids and
max_tokens; the generator ends a row itself at max_tokens or a stop token, exactly where
the scheduler's :class:`~vllm_mlx_trio.core.request.Request` does.
"""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from ..config import EngineConfig
from ..messages import KVReady, ModelInfo, NewSequence, RequestId, StepPlan, StepResult
from .kv_store import PrefixBlocks
from .loading import load_for_serving, mlx_memory
from .sampling import (
    greedy,
    guard_processors,
    make_request_processors,
    make_request_sampler,
    token_logprob,
)


class BatchRunner:
    """Executes step plans on one shared batch; created and used only on the MLX thread."""

    #: One plan queued so the MLX thread starts the next step without waiting for Trio.
    plans_in_flight = 2
    max_tokens_per_step = 1

    @classmethod
    def max_running(cls, engine) -> int:
        return engine.max_num_seqs

    def __init__(self, cfg: EngineConfig):
        self._cfg = cfg
        self._info: ModelInfo | None = None
        self._generator: BatchGenerator | None = None
        self._request_ids: dict[int, RequestId] = {}  # BatchGenerator uid -> request
        self._uids: dict[RequestId, int] = {}
        self._num_logprobs: dict[RequestId, int] = {}
        self._sequences: dict[RequestId, NewSequence] = {}
        self._prefix: PrefixBlocks | None = None
        #: Requests whose own processing failed this step, with the cause.
        self._failures: dict[str, str] = {}

    def load(self) -> ModelInfo:
        model, self._info = load_for_serving(self._cfg.model, self._cfg.engine)
        self._prefix = PrefixBlocks(
            model, self._cfg.cache.block_size, enabled=self._cfg.cache.enabled
        )
        engine = self._cfg.engine
        self._generator = BatchGenerator(
            model,
            sampler=greedy,
            completion_batch_size=engine.completion_batch_size,
            prefill_batch_size=engine.prefill_batch_size,
            prefill_step_size=engine.prefill_step_size,
            stream=mx.new_stream(mx.default_device()),
        )
        return self._info

    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        assert self._generator is not None and self._prefix is not None
        self._prefix.apply(plan)
        self._remove(plan.finished_ids)
        self._insert(plan.new_seqs)
        prompt_progress, generated = self._generator.next()
        kv_ready = [self._prompt_ready(r.uid) for r in prompt_progress if r.end_of_prompt]
        sampled, logprobs = [], []
        for response in generated:
            rid = self._request_ids[response.uid]
            sampled.append((rid, (response.token,)))
            num_top = self._num_logprobs.get(rid)
            if num_top is not None:
                logprobs.append((rid, (token_logprob(response.logprobs, response.token, num_top),)))
            if response.finish_reason is not None:
                kv_ready.append(self._finished_ready(rid, response))
                self._forget(rid)
        failed = self._take_failures()
        if failed:  # a failed request's token from this step is not delivered
            gone = {rid for rid, _ in failed}
            sampled = [entry for entry in sampled if entry[0] not in gone]
            logprobs = [entry for entry in logprobs if entry[0] not in gone]
        return StepResult(
            step_id=plan.step_id,
            sampled=tuple(sampled),
            logprobs=tuple(logprobs),
            failed=failed,
            kv_ready=tuple(ready for ready in kv_ready if ready is not None),
            elapsed_s=time.perf_counter() - started,
            memory=mlx_memory(idle=not self.num_sequences),
        )

    def _take_failures(self) -> tuple[tuple[RequestId, str], ...]:
        """Remove the rows whose processing failed; report them (the rest go on)."""
        failed = tuple((RequestId(rid), message) for rid, message in self._failures.items())
        self._failures.clear()
        self._remove(tuple(rid for rid, _ in failed))
        return failed

    def _prompt_ready(self, uid: int) -> KVReady | None:
        """The prompt is processed: copy its new full blocks for the prefix store."""
        assert self._generator is not None and self._prefix is not None
        rid = self._request_ids.get(uid)
        if rid is None or not self._prefix.enabled:
            return None
        seq = self._sequences[rid]
        cache, _tokens = self._generator.extract_cache([uid])[uid]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        return self._prefix.ready(rid, seq.prompt_token_ids, cache, first_block)

    def _finished_ready(self, rid: RequestId, response) -> KVReady | None:
        """A sequence finished: its prompt + output blocks, for the next turn of a chat."""
        assert self._prefix is not None
        if not self._cfg.cache.store_generated or response.prompt_cache is None:
            return None
        seq = self._sequences[rid]
        first_block = len(seq.prompt_token_ids) // self._prefix.block_size
        return self._prefix.ready(rid, tuple(response.all_tokens), response.prompt_cache, first_block)

    def _insert(self, seqs: tuple[NewSequence, ...]) -> None:
        if not seqs:
            return
        assert self._generator is not None and self._prefix is not None
        rows = [self._row(seq) for seq in seqs]
        uids = self._generator.insert(
            [list(seq.prompt_token_ids[seq.num_cached_tokens :]) for seq in seqs],
            caches=[self._prefix.cache_for(seq) for seq in seqs],
            all_tokens=[list(seq.prompt_token_ids[: seq.num_cached_tokens]) for seq in seqs],
            max_tokens=[seq.max_new_tokens for seq in seqs],
            samplers=[row[0] for row in rows],
            logits_processors=[row[1] for row in rows],
            stop_sequences=[row[2] for row in rows],
        )
        for uid, seq in zip(uids, seqs, strict=True):
            self._request_ids[uid] = seq.request_id
            self._uids[seq.request_id] = uid
            self._sequences[seq.request_id] = seq
            if seq.params.logprobs is not None:
                self._num_logprobs[seq.request_id] = seq.params.logprobs

    def _row(self, seq: NewSequence) -> tuple:
        """(sampler, logits processors, stop sequences) for one new row."""
        assert self._info is not None
        params = seq.params
        stop_ids = params.stop_ids(self._info.eos_token_ids)
        return (
            make_request_sampler(params, self._info.vocab_size, seq.num_output_tokens),
            guard_processors(
                make_request_processors(params, stop_ids=stop_ids, generated=seq.output_token_ids),
                seq.request_id,
                self._failures,
            ),
            StopSequences([[t] for t in stop_ids] or None),
        )

    def _remove(self, request_ids: tuple[RequestId, ...]) -> None:
        uids = [self._uids[rid] for rid in request_ids if rid in self._uids]
        if uids:
            assert self._generator is not None
            self._generator.remove(uids)
        for rid in request_ids:
            self._forget(rid)

    def _forget(self, request_id: RequestId) -> None:
        uid = self._uids.pop(request_id, None)
        if uid is not None:
            del self._request_ids[uid]
        self._num_logprobs.pop(request_id, None)
        self._sequences.pop(request_id, None)

    @property
    def num_sequences(self) -> int:
        return len(self._uids)

    def close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        if self._prefix is not None:
            self._prefix.close()
        self._request_ids.clear()
        self._uids.clear()
        mx.clear_cache()
