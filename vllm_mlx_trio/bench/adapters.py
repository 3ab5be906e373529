"""``vllm-mlx-trio bench adapters``: throughput of a batch whose rows run different LoRA adapters.

One batched engine serves the base with the configured named adapters (``[model] adapters``;
with none configured, a demo model's demo adapters). Settings alternate on it:
every row the base (baseline), every row one adapter, and rows cycling over the base and every
adapter (mixed in one batch, each row its own). Each run is one batch of greedy rows; its
aggregate tok/s is all its tokens over the batch's wall time. The table gives, per setting, the
median (min-max) of the runs and the ratio to the base's median, and ``paired``: the median of
each run's ratio to the base run just before it (robust to load drift).
"""

from __future__ import annotations

import statistics

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from ..errors import ConfigError
from ..worker.demo.adapter import DEMO_ADAPTERS
from ..worker.demo.recipe import DEMO_PREFIX
from .workload import bench_prompts, chat


def with_adapters(cfg: EngineConfig) -> EngineConfig:
    """``cfg`` in batched mode, with the model's demo adapters (a, b, ...) when it names none."""
    adapters = cfg.model.adapters or tuple(
        (chr(ord("a") + i), f"{DEMO_PREFIX}{name}")
        for i, name in enumerate(name for name, base in DEMO_ADAPTERS.items() if base == cfg.model.path)
    )
    if not adapters:
        raise ConfigError(f"bench adapters: model {cfg.model.path!r} has no demo adapters; set model.adapters")
    model = attrs.evolve(cfg.model, adapters=adapters)
    return attrs.evolve(cfg, model=model, engine=attrs.evolve(cfg.engine, mode="batched"))


def settings(adapters: tuple[str, ...]) -> dict[str, tuple[str | None, ...]]:
    """Each setting's row cycle: the base, the first adapter alone, the base and every adapter mixed."""
    return {"base": (None,), f"adapter {adapters[0]}": (adapters[0],), "mixed": (None, *adapters)}


async def measure_once(engine: Engine, cycle: tuple[str | None, ...], *, rows: int, max_tokens: int) -> float:
    """One batch of ``rows`` greedy rows, row i with adapter ``cycle[i % len(cycle)]``: its tok/s."""
    tokens = 0

    async def row(i: int, text: str) -> None:
        nonlocal tokens
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, adapter=cycle[i % len(cycle)])
        async for delta in engine.generate(chat(text), params):
            tokens += len(delta.token_ids)

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        for i, text in enumerate(bench_prompts(rows)):
            nursery.start_soon(row, i, text)
    return tokens / (trio.current_time() - start)


async def measure_adapters(cfg: EngineConfig, runs: int = 3, *, rows: int = 6, max_tokens: int = 64) -> list[dict]:
    """Alternating runs of every setting after one warm-up of each; one table row per setting."""
    cfg = with_adapters(cfg)
    cycles = settings(tuple(name for name, _ in cfg.model.adapters))
    results: dict[str, list[float]] = {name: [] for name in cycles}
    async with open_engine(cfg) as engine:
        for cycle in cycles.values():
            await measure_once(engine, cycle, rows=rows, max_tokens=max_tokens)
        for _run in range(runs):
            for name, cycle in cycles.items():
                results[name].append(await measure_once(engine, cycle, rows=rows, max_tokens=max_tokens))
    return adapter_rows(results)


def adapter_rows(results: dict[str, list[float]]) -> list[dict]:
    base = results["base"]
    baseline = statistics.median(base)
    return [
        {
            "setting": name,
            "runs": len(runs),
            "agg_tok_s": _spread(runs),
            "ratio": f"{statistics.median(runs) / baseline:.3f}",
            "paired": _spread([r / b for b, r in zip(base, runs, strict=True)], 3),
        }
        for name, runs in results.items()
    ]


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
