"""``bench engine``: our engine in-process (``open_engine``), no HTTP.

Simple mode runs at concurrency 1; batched mode at every level of the workload. At level C,
C tasks each take the next prompt until ``max(C, min_requests)`` requests are done (a closed
loop), after a warm-up of C short requests. Greedy with ``ignore_eos``, so each request should
yield ``max_tokens`` tokens; the tables count what actually came back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from .stats import RequestTrace, add_ratio, summarize
from .workload import WARMUP_TOKENS, PromptBlocks, Workload, chat

#: Warm-up prompts come from far into the prompt sequence: no prefix is shared with a measured one.
WARMUP_FIRST_PROMPT = 5000
MODES = ("simple", "batched")


def bench_params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


async def traced_request(engine: Engine, prompt: str, params: SamplingParams) -> RequestTrace:
    """Run one request; time each delta that carries tokens."""
    start, arrivals = time.perf_counter(), []
    async with engine.open_request(chat(prompt), params) as stream:
        async for delta in stream:
            if delta.token_ids:
                arrivals.append((time.perf_counter(), len(delta.token_ids)))
        end = time.perf_counter()
        counted = stream.num_completion_tokens or sum(n for _t, n in arrivals)
        return RequestTrace(
            start=start,
            arrivals=tuple(arrivals),
            completion_tokens=counted,
            prompt_tokens=stream.num_prompt_tokens,
            end=end,
        )


async def closed_loop(
    engine: Engine, prompts: Sequence[str], concurrency: int, params: SamplingParams
) -> list[RequestTrace]:
    """``concurrency`` tasks share the prompts; each runs one request at a time."""
    traces: list[RequestTrace] = []
    queue: Iterable[str] = iter(prompts)

    async def client() -> None:
        for prompt in queue:
            traces.append(await traced_request(engine, prompt, params))

    async with trio.open_nursery() as nursery:
        for _ in range(min(concurrency, len(prompts))):
            nursery.start_soon(client)
    return traces


async def _run_mode(cfg: EngineConfig, levels: Sequence[int], workload: Workload, executor_factory) -> list[dict]:
    params = bench_params(workload.max_tokens)
    warmup_params = bench_params(WARMUP_TOKENS)
    blocks, warmups = PromptBlocks(), PromptBlocks(WARMUP_FIRST_PROMPT)
    rows = []
    async with open_engine(cfg, executor_factory=executor_factory) as engine:
        for concurrency in levels:
            prompts = blocks.take(workload.num_requests(concurrency))
            await closed_loop(engine, warmups.take(concurrency), concurrency, warmup_params)
            traces = await closed_loop(engine, prompts, concurrency, params)
            rows.append(summarize(f"engine {cfg.engine.mode}", concurrency, traces))
    return rows


def mode_levels(mode: str, workload: Workload) -> tuple[int, ...]:
    """Simple mode runs one request at a time; batched mode every level."""
    return (1,) if mode == "simple" else workload.concurrency


def run_engine_bench(
    cfg: EngineConfig,
    workload: Workload,
    *,
    modes: Sequence[str] = MODES,
    ceiling=None,
    executor_factory=None,
) -> list[dict]:
    """One engine per mode, one after the other; ``vs_ceiling`` when a ceiling is given."""
    rows = []
    for mode in modes:
        mode_cfg = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode=mode))
        rows += trio.run(_run_mode, mode_cfg, mode_levels(mode, workload), workload, executor_factory)
    for row in rows:
        add_ratio(row, ceiling.reference(row["conc"]) if ceiling else None)
    return rows
