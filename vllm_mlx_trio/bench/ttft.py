"""``vllm-mlx-trio bench ttft``: time to first token of one prompt on an idle engine.

The ceiling is mlx-lm's ``generate_step`` producing its first token (the prefill plus one
sample), in a child process of its own (:class:`CeilingProcess`). The same prompts go to an
idle engine in batched and in simple mode. Samples are interleaved (ceiling, batched, simple,
ceiling, ...) so all three share the machine's drifts; the table gives medians and the
difference to the ceiling in milliseconds.
"""

from __future__ import annotations

import statistics

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from .ceiling.process import CeilingProcess
from .workload import bench_prompts, chat

#: Samples per path; medians over this many resist the odd slow sample.
DEFAULT_SAMPLES = 8


def _with_mode(cfg: EngineConfig, mode: str) -> EngineConfig:
    return attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode=mode))


async def _engine_ttft(engine: Engine, prompt: list[dict]) -> float:
    start = trio.current_time()
    async with engine.open_request(prompt, SamplingParams(temperature=0.0, max_tokens=1)) as stream:
        async for _delta in stream:
            return trio.current_time() - start
    raise AssertionError("the request produced no token")


async def measure_ttft(cfg: EngineConfig, samples: int = DEFAULT_SAMPLES) -> dict[str, list[float]]:
    """Interleaved first-token times (seconds) for the ceiling, batched and simple mode."""
    prompts = [chat(p) for p in bench_prompts(samples + 1)]
    ceiling = await trio.to_thread.run_sync(CeilingProcess, cfg)
    try:
        return await _interleaved(cfg, ceiling, prompts, samples)
    finally:
        await trio.to_thread.run_sync(ceiling.close)


async def _interleaved(
    cfg: EngineConfig, ceiling: CeilingProcess, prompts: list[list[dict]], samples: int
) -> dict[str, list[float]]:
    encoded = [await trio.to_thread.run_sync(ceiling.encode, p) for p in prompts]
    times: dict[str, list[float]] = {"mlx-lm generate_step": [], "engine batched": [], "engine simple": []}
    async with open_engine(_with_mode(cfg, "batched")) as batched, open_engine(_with_mode(cfg, "simple")) as simple:
        await trio.to_thread.run_sync(ceiling.first_token_seconds, encoded[-1])  # warm-ups
        await _engine_ttft(batched, prompts[-1])
        await _engine_ttft(simple, prompts[-1])
        for index in range(samples):
            ceiling_s = await trio.to_thread.run_sync(ceiling.first_token_seconds, encoded[index])
            times["mlx-lm generate_step"].append(ceiling_s)
            times["engine batched"].append(await _engine_ttft(batched, prompts[index]))
            times["engine simple"].append(await _engine_ttft(simple, prompts[index]))
    return times


def ttft_rows(times: dict[str, list[float]], num_prompt_tokens: float | None = None) -> list[dict]:
    """One row per path: median and p95-ish max, and the median's distance to the ceiling."""
    ceiling_ms = statistics.median(times["mlx-lm generate_step"]) * 1000
    rows = []
    for path, values in times.items():
        median_ms = statistics.median(values) * 1000
        rows.append(
            {
                "path": path,
                "samples": len(values),
                "ttft_p50_ms": round(median_ms, 1),
                "ttft_max_ms": round(max(values) * 1000, 1),
                "vs_ceiling_ms": round(median_ms - ceiling_ms, 1),
            }
        )
    return rows
