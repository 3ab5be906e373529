"""``bench ceiling``: mlx-lm's own loops, the figures the engine is measured against.

Concurrency 1 runs ``generate_step`` one request at a time; every higher level inserts that
many prompts at once into mlx-lm's ``BatchGenerator`` (TTFT is from the insert to each
sequence's first token). Greedy, no EOS stop: every request yields exactly ``max_tokens``.
The loops run in a child process of their own (:class:`CeilingProcess`).
"""

from __future__ import annotations

import attrs

from ...config import EngineConfig
from ..stats import RequestTrace, add_ratio, summarize
from ..workload import PromptBlocks, Workload, chat
from .process import CeilingProcess


@attrs.frozen(kw_only=True)
class CeilingResult:
    rows: list[dict]
    #: concurrency -> aggregate completion tokens/s: what the engine's rows are divided by.
    agg_tok_s: dict[int, float]
    #: The machine info of the process that ran the loops (its MLX device and BLAS).
    machine: dict

    def reference(self, concurrency: int) -> float | None:
        return self.agg_tok_s.get(concurrency)


def path_name(concurrency: int) -> str:
    if concurrency == 1:
        return "mlx-lm generate_step"
    return f"mlx-lm BatchGenerator-{concurrency}"


def traces_from_runs(runs) -> list[RequestTrace]:
    """Ceiling runs (one timestamp per token) as request traces."""
    return [
        RequestTrace(
            start=run.start,
            arrivals=tuple((t, 1) for t in run.token_times),
            completion_tokens=len(run.token_ids),
            prompt_tokens=run.num_prompt_tokens,
        )
        for run in runs
    ]


def run_ceiling_bench(cfg: EngineConfig, workload: Workload) -> CeilingResult:
    """Load the model once in a child process, run every level, and end the child again."""
    blocks = PromptBlocks()
    rows, agg = [], {}
    with CeilingProcess(cfg) as model:
        for concurrency in workload.concurrency:
            prompts = [chat(p) for p in blocks.take(workload.num_requests(concurrency))]
            if concurrency == 1:
                runs = model.single(prompts, num_tokens=workload.max_tokens)
            else:
                runs = batched_waves(model, prompts, concurrency, workload.max_tokens)
            row = summarize(path_name(concurrency), concurrency, traces_from_runs(runs))
            rows.append(add_ratio(row, row["agg_tok_s"]))
            agg[concurrency] = row["agg_tok_s"]
    return CeilingResult(rows=rows, agg_tok_s=agg, machine=model.machine)


def batched_waves(model: CeilingProcess, prompts: list[list[dict]], concurrency: int, max_tokens: int):
    """Waves of ``concurrency`` prompts, each wave one BatchGenerator run."""
    runs = []
    for i in range(0, len(prompts), concurrency):
        runs += model.batch(prompts[i : i + concurrency], num_tokens=max_tokens, warmup=i == 0)
    return runs
