"""``vllm-mlx-trio bench structured``: what a grammar-constrained row costs in a shared batch.

Two settings alternate on one batched engine: every row unconstrained (baseline), and the
same batch with its first row constrained (``response_format`` json_object, compiled and
cached by the first run). Each row's decode speed is its tokens after the first delta over
the time they took. The table gives, per setting, the median of the runs (and their spread)
of the unconstrained rows' mean tok/s and of the constrained row's, and the ratios to the
baseline: the targets are neighbours within 5 % and the constrained row within 25 %.
``cpu_ms_per_token`` is this process's CPU time over the batch's tokens: unlike wall time it
barely moves when other processes load the machine, and it shows what the mask computes.
"""

from __future__ import annotations

import statistics
import time

import attrs
import trio

from ..config import EngineConfig
from ..core.constraint import ConstraintSpec
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from .workload import bench_prompts, chat

#: Rows in the batch (the constrained one included).
BATCH_ROWS = 4
#: Any JSON object: on a random-weight model it rarely closes, so the row stays in the batch.
CONSTRAINT = ConstraintSpec(kind="json_object", body="")


async def _row(engine: Engine, prompt: list[dict], params: SamplingParams, out: dict, key: str) -> None:
    first: float | None = None
    tokens = 0
    async for delta in engine.generate(prompt, params):
        now = trio.current_time()
        if first is None:
            first = now
        else:
            tokens += len(delta.token_ids)
        last = now
    elapsed = last - first if first is not None else 0.0
    out[key] = {"tok_s": tokens / elapsed if elapsed > 0 else None, "tokens": tokens + 1}


async def measure_once(engine: Engine, *, constrained: bool, rows: int, max_tokens: int) -> dict:
    """One batch; ``constrained``: row 0 carries the JSON constraint."""
    plain = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    json_row = SamplingParams(temperature=0.0, max_tokens=max_tokens, constraint=CONSTRAINT)
    out: dict[str, dict] = {}
    cpu_start = time.process_time()  # every thread of this process: the MLX thread's work included
    async with trio.open_nursery() as nursery:
        for i, text in enumerate(bench_prompts(rows)):
            params = json_row if constrained and i == 0 else plain
            nursery.start_soon(_row, engine, chat(text), params, out, str(i))
    cpu_s = time.process_time() - cpu_start
    neighbours = [out[str(i)]["tok_s"] for i in range(1 if constrained else 0, rows)]
    return {
        "cpu_ms_per_token": 1000 * cpu_s / sum(row["tokens"] for row in out.values()),
        "neighbours_tok_s": statistics.fmean(v for v in neighbours if v is not None),
        "constrained_tok_s": out["0"]["tok_s"] if constrained else None,
        "constrained_tokens": out["0"]["tokens"] if constrained else None,
    }


async def measure_structured(
    cfg: EngineConfig, runs: int = 3, *, rows: int = BATCH_ROWS, max_tokens: int = 64
) -> list[dict]:
    """Alternating runs of both settings after one warm-up of each; one row per setting."""
    cfg = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode="batched"))
    results: dict[str, list[dict]] = {"unconstrained": [], "one constrained row": []}
    async with open_engine(cfg) as engine:
        for constrained in (False, True):  # warm-up: compile paths, the grammar cache, the tokenizer
            await measure_once(engine, constrained=constrained, rows=rows, max_tokens=max_tokens)
        for _run in range(runs):
            for name, constrained in (("unconstrained", False), ("one constrained row", True)):
                run = await measure_once(engine, constrained=constrained, rows=rows, max_tokens=max_tokens)
                results[name].append(run)
    return structured_rows(results)


def structured_rows(results: dict[str, list[dict]]) -> list[dict]:
    """One row per setting. ``*_ratio``: medians over the baseline's median; ``paired_*``: the
    median of each run's ratio to the unconstrained run just before it (robust to load drift)."""
    plain_runs = results["unconstrained"]
    baseline = statistics.median(r["neighbours_tok_s"] for r in plain_runs)
    out = []
    for name, runs in results.items():
        neighbours = [r["neighbours_tok_s"] for r in runs]
        constrained = [r["constrained_tok_s"] for r in runs if r["constrained_tok_s"] is not None]
        pairs = list(zip(plain_runs, runs, strict=True))
        out.append(
            {
                "setting": name,
                "runs": len(runs),
                "neighbour_tok_s": _spread(neighbours),
                "neighbour_ratio": f"{statistics.median(neighbours) / baseline:.3f}",
                "paired_neighbour": _spread([r["neighbours_tok_s"] / p["neighbours_tok_s"] for p, r in pairs], 3),
                "constrained_tok_s": _spread(constrained) if constrained else "-",
                "constrained_ratio": f"{statistics.median(constrained) / baseline:.3f}" if constrained else "-",
                "paired_constrained": _spread([r["constrained_tok_s"] / p["neighbours_tok_s"] for p, r in pairs], 3)
                if constrained
                else "-",
                "cpu_ms_per_token": _spread([r["cpu_ms_per_token"] for r in runs]),
                "constrained_tokens": _spread([r["constrained_tokens"] for r in runs if r["constrained_tokens"]], 0)
                if constrained
                else "-",
            }
        )
    return out


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
