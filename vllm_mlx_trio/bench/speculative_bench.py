"""``vllm-mlx-trio bench speculative``: tokens/s with speculative decoding on vs off, and its acceptance.

Two engines on the same target are loaded side by side, one with ``speculative.method = "off"``, one with the draft
model (by default the agreeing demo pair ``demo:spec-target`` / ``demo:spec-draft``). For each concurrency level
(1: inside the envelope; 5: outside it, every step takes the batched path) the settings alternate, off then on, for
``runs`` rounds after one warm-up each, so load drift hits both alike. A run is ``streams`` greedy requests started
together; its tok/s is their tokens over its wall time. Acceptance is the on-engine's accepted over proposed draft
tokens during that level's measured runs. Outputs are compared: speculation must not change a token.
"""

from __future__ import annotations

import statistics
import time

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..core.speculative import SpecDecodeCounts
from ..engine import Engine, open_engine
from .workload import bench_prompts, chat

DEFAULT_TARGET = "demo:spec-target"
DEFAULT_DRAFT = "demo:spec-draft"
#: Concurrency levels: one stream (speculation runs) and five (the envelope falls back to batching).
DEFAULT_LEVELS = (1, 5)


async def _one(engine: Engine, prompt: str, params: SamplingParams, out: list) -> None:
    out.append([t async for delta in engine.generate(chat(prompt), params) for t in delta.token_ids])


async def measure_run(engine: Engine, streams: int, max_tokens: int, first_prompt: int) -> tuple[float, list]:
    """``streams`` greedy requests at once: (tok/s over the run's wall time, each request's tokens)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outputs: list[list[int]] = []
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for prompt in bench_prompts(streams, first_prompt):
            nursery.start_soon(_one, engine, prompt, params, outputs)
    elapsed = time.perf_counter() - started
    return sum(len(tokens) for tokens in outputs) / elapsed, sorted(outputs)


def _configs(cfg: EngineConfig, draft_model: str, num_draft_tokens: int) -> tuple[EngineConfig, EngineConfig]:
    batched = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode="batched"))
    off = attrs.evolve(batched, speculative=attrs.evolve(cfg.speculative, method="off"))
    method = "mtp" if cfg.speculative.method == "mtp" else "draft"  # --set speculative.method=mtp: the MTP head
    on = attrs.evolve(batched, speculative=attrs.evolve(cfg.speculative, method=method, draft_model=draft_model,
                                                        num_draft_tokens=num_draft_tokens))  # fmt: skip
    return off, on


async def measure_speculative(
    cfg: EngineConfig, *, draft_model: str, num_draft_tokens: int = 4, runs: int = 3, max_tokens: int = 128,
    levels: tuple[int, ...] = DEFAULT_LEVELS,
) -> list[dict]:  # fmt: skip
    """One row per level: off and on tok/s (median, min-max), speedup, acceptance; outputs must agree."""
    off_cfg, on_cfg = _configs(cfg, draft_model, num_draft_tokens)
    rows = []
    async with open_engine(off_cfg) as off, open_engine(on_cfg) as on:
        for streams in levels:
            for engine in (off, on):  # warm-up
                await measure_run(engine, streams, max_tokens, first_prompt=0)
            tok_s: dict[str, list[float]] = {"off": [], "on": []}
            before = on.metrics.spec_decode
            identical = True
            for run in range(runs):
                first = 1 + run * streams  # fresh prompts each run, the same for both settings
                off_tok_s, off_out = await measure_run(off, streams, max_tokens, first)
                on_tok_s, on_out = await measure_run(on, streams, max_tokens, first)
                tok_s["off"].append(off_tok_s)
                tok_s["on"].append(on_tok_s)
                identical = identical and off_out == on_out
            rows.append(_row(streams, tok_s, _since(before, on.metrics.spec_decode), identical))
    return rows


def _since(before: SpecDecodeCounts, after: SpecDecodeCounts) -> SpecDecodeCounts:
    return SpecDecodeCounts(
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
    )


def _row(streams: int, tok_s: dict[str, list[float]], counts: SpecDecodeCounts, identical: bool) -> dict:
    off, on = statistics.median(tok_s["off"]), statistics.median(tok_s["on"])
    paired = [b / a for a, b in zip(tok_s["off"], tok_s["on"], strict=True)]
    rate, length = counts.acceptance_rate, counts.mean_accepted_length
    return {
        "streams": streams,
        "off_tok_s": _spread(tok_s["off"]),
        "on_tok_s": _spread(tok_s["on"]),
        "speedup": f"{on / off:.2f}",
        "paired_speedup": _spread(paired, 2),
        "acceptance": "-" if rate is None else f"{rate:.3f}",
        "tokens_per_round": "-" if length is None else f"{length:.2f}",
        "rounds": counts.num_drafts,
        "identical": "yes" if identical else "NO",
    }


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
