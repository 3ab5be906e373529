"""EmbedRunner: an embedding model on the MLX thread (``engine.mode = "embed"``).

It generates nothing (admission refuses generation requests on it); it answers the facade's
:class:`EmbedJob` s, which the executor hands it in batches (``run_jobs``): every row of every
job queued together is run through the model's backbone (``model.model``: the hidden states
after the final norm), rows of similar length in one forward pass of at most
``engine.prefill_step_size`` padded tokens. Rows are padded on the right: the model's attention
is causal, so a row's own positions never see its padding, and its vector is the one it has
alone. Each row is pooled (``[model] pooling``), cut to the job's ``dimensions`` and
L2-normalised.
"""

from __future__ import annotations

import threading
from typing import Any

import mlx.core as mx
import numpy as np

from ...config import EngineConfig
from ...core.text import byte_level_table
from ...errors import ExecutorCrashedError, ModelLoadError
from ...messages import EmbeddingInfo, EmbedJob, EmbedReply, ModelInfo, StepPlan, StepResult
from ...runner_kinds import RunnerShape
from ..loading import context_length, load_model, resolve_model_path
from ..thread_streams import enter_mlx_thread, leave_mlx_thread
from .pooling import local_model_dir, resolve_pooling

#: Below this norm a vector is left unscaled (an all-zero vector stays zero, as torch's
#: ``F.normalize`` leaves it).
NORM_EPS = 1e-12


class EmbedRunner:
    """The runner kind ``embed``: loads the model, pools its hidden states into vectors."""

    publish = None

    def __init__(self, cfg: EngineConfig, *, request_waiting: threading.Event | None = None):
        self._cfg = cfg
        self._model: Any = None
        self._pooling = "last"

    @classmethod
    def shape(cls, cfg: EngineConfig) -> RunnerShape:
        # Never sent a plan (admission refuses generation here): the window is lock-step.
        return RunnerShape(plans_in_flight=1, max_tokens_per_step=1, max_running=cfg.engine.max_num_seqs)

    def load(self) -> ModelInfo:
        enter_mlx_thread()
        model_cfg = self._cfg.model
        model, tokenizer, config = load_model(model_cfg)
        if not callable(getattr(model, "model", None)):
            raise ModelLoadError(f"model {model_cfg.path!r}: no backbone (model.model) to take hidden states from")
        self._model = model
        self._stream = mx.new_stream(mx.default_device())
        self._pooling = resolve_pooling(model_cfg.pooling, local_model_dir(resolve_model_path(model_cfg)))
        dims = int(config.get("hidden_size") or config.get("text_config", {}).get("hidden_size"))
        matryoshka_dims = tuple(config.get("matryoshka_dimensions") or ())
        return ModelInfo(
            model_path=resolve_model_path(model_cfg),
            max_context_tokens=context_length(config),
            vocab_size=int(config.get("vocab_size") or len(tokenizer.get_vocab())),
            eos_token_ids=tuple(sorted(tokenizer.eos_token_ids)),
            tokenizer=tokenizer,
            token_bytes=byte_level_table(tokenizer),
            embedding=EmbeddingInfo(
                dims=dims,
                pooling=self._pooling,
                matryoshka=bool(config.get("is_matryoshka")) or bool(matryoshka_dims),
                matryoshka_dimensions=matryoshka_dims,
            ),
        )

    def execute(self, plan: StepPlan) -> StepResult:
        raise ExecutorCrashedError("an embedding model was sent a generation plan (admission refuses them)")

    def run_jobs(self, jobs: list[EmbedJob]) -> list[EmbedReply]:
        """Every job's rows in batches; one reply per job, its vectors in its rows' order."""
        rows = [row for job in jobs for row in job.inputs]
        pooled = self.pool_rows(rows)
        replies, start = [], 0
        for job in jobs:
            mine = pooled[start : start + len(job.inputs)]
            start += len(job.inputs)
            replies.append(EmbedReply(vectors=tuple(normalized(v, job.dimensions) for v in mine)))
        return replies

    def pool_rows(self, rows: list[tuple[int, ...]]) -> list[np.ndarray]:
        """Each row's pooled float32 vector (not normalised), in the rows' order."""
        pooled: list[np.ndarray | None] = [None] * len(rows)
        for batch in _length_batches(rows, self._cfg.engine.prefill_step_size):
            vectors = self._pool_batch([rows[i] for i in batch])
            for i, vector in zip(batch, vectors, strict=True):
                pooled[i] = vector
        return pooled  # type: ignore[return-value]

    def _pool_batch(self, rows: list[tuple[int, ...]]) -> np.ndarray:
        width = max(len(row) for row in rows)
        padded = mx.array([list(row) + [0] * (width - len(row)) for row in rows], dtype=mx.uint32)
        with mx.stream(self._stream):
            hidden = self._model.model(padded).astype(mx.float32)
            vectors = mx.stack([_pool(hidden[i], len(row), self._pooling) for i, row in enumerate(rows)])
            mx.eval(vectors)
        return np.array(vectors)

    def close(self) -> None:
        self._model = None
        leave_mlx_thread()


def _pool(hidden: mx.array, length: int, pooling: str) -> mx.array:
    """One row's vector from its hidden states (``length`` real positions, then padding)."""
    if pooling == "mean":
        return hidden[:length].mean(axis=0)
    if pooling == "cls":
        return hidden[0]
    return hidden[length - 1]


def normalized(vector: np.ndarray, dimensions: int | None) -> tuple[float, ...]:
    """The first ``dimensions`` floats (all when None), scaled to unit L2 norm."""
    cut = vector[:dimensions] if dimensions is not None else vector
    norm = float(np.linalg.norm(cut))
    return tuple((cut / norm if norm > NORM_EPS else cut).tolist())


def _length_batches(rows: list[tuple[int, ...]], max_tokens: int) -> list[list[int]]:
    """Row indices grouped by length (shortest first) so that rows x longest row stays within
    ``max_tokens``; a row longer than that goes alone."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    batches: list[list[int]] = []
    for i in order:
        batch = batches[-1] if batches else None
        if batch is not None and (len(batch) + 1) * len(rows[i]) <= max_tokens:
            batch.append(i)
        else:
            batches.append([i])
    return batches
