"""Simple mode on the MLX thread: one sequence at a time through mlx-lm's ``generate_step``.

``generate_step`` already overlaps the next token's compute (``mx.async_eval``) with the
host work on the current one, so a step here costs one forward pass of model time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import mlx.core as mx
from mlx_lm.generate import generate_step

from ..config import EngineConfig
from ..messages import ModelInfo, NewSequence, RequestId, StepPlan, StepResult
from .loading import context_length, load_model, resolve_model_path
from .sampling import make_request_processors, make_request_sampler


class SimpleRunner:
    """Executes step plans; created and used only on the executor's thread."""

    def __init__(self, cfg: EngineConfig):
        self._cfg = cfg
        self._model = None
        self._stream = None
        self._vocab_size = 0
        self._sequences: dict[RequestId, Iterator[tuple[int, mx.array]]] = {}

    def load(self) -> ModelInfo:
        model, tokenizer, config = load_model(self._cfg.model)
        self._model = model
        self._stream = mx.new_stream(mx.default_device())
        self._vocab_size = int(config.get("vocab_size") or len(tokenizer.get_vocab()))
        return ModelInfo(
            model_path=resolve_model_path(self._cfg.model),
            max_context_tokens=context_length(config),
            vocab_size=self._vocab_size,
            eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),
            tokenizer=tokenizer,
        )

    def execute(self, plan: StepPlan) -> StepResult:
        started = time.perf_counter()
        for request_id in plan.finished_ids:
            generator = self._sequences.pop(request_id, None)
            if generator is not None:
                generator.close()
        for seq in plan.new_seqs:
            self._sequences[seq.request_id] = self._start(seq)
        step_ids = (*(s.request_id for s in plan.new_seqs), *plan.decode_ids)
        sampled = tuple((rid, (next(self._sequences[rid])[0],)) for rid in step_ids)
        return StepResult(
            step_id=plan.step_id, sampled=sampled, elapsed_s=time.perf_counter() - started
        )

    def _start(self, seq: NewSequence) -> Iterator[tuple[int, mx.array]]:
        assert seq.num_cached_tokens == 0, "the prefix store hands out no blocks yet"
        params = seq.params
        return generate_step(
            mx.array(seq.prompt_token_ids, dtype=mx.uint32),
            self._model,
            stream=self._stream,
            max_tokens=params.max_tokens,
            sampler=make_request_sampler(params, self._vocab_size),
            logits_processors=make_request_processors(params),
            prefill_step_size=self._cfg.engine.prefill_step_size,
        )

    @property
    def num_sequences(self) -> int:
        return len(self._sequences)

    def close(self) -> None:
        for generator in self._sequences.values():
            generator.close()
        self._sequences.clear()
        self._model = None
        mx.clear_cache()
