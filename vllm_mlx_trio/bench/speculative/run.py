"""``vllm-mlx-trio bench speculative``: tokens/s with speculative decoding on vs off, and its acceptance.

Two engines on the same target are loaded side by side, one with ``speculative.method = "off"``, one with the draft
model (by default the agreeing demo pair ``demo:spec-target`` / ``demo:spec-draft``). For each concurrency level
(1, 2, 4, 8 by default: with a draft model every stream speculates, several rows a round) the settings alternate,
off then on, for
``runs`` rounds after one warm-up each, so load drift hits both alike. A run is ``streams`` greedy requests started
together; its tok/s is their tokens over its wall time. Acceptance is the on-engine's accepted over proposed draft
tokens during that level's measured runs. Outputs are compared: speculation must not change a token. A last row
runs one unseeded request sampled at ``sampled_temperature`` (rejection sampling on; its draws differ run to run).
"""

from __future__ import annotations

import statistics
import time

import attrs
import trio

from ...config import EngineConfig
from ...core.params import SamplingParams
from ...core.speculative import SpecDecodeCounts
from ...engine import Engine, open_engine
from ..workload import bench_prompts, chat

DEFAULT_TARGET = "demo:spec-target"
DEFAULT_DRAFT = "demo:spec-draft"
#: Concurrency levels: one stream, and batches where speculation pays less as the rows grow.
DEFAULT_LEVELS = (1, 2, 4, 8)


@attrs.define
class _Stream:
    """One request of a run: its tokens, and when its first and last tokens arrived (perf_counter seconds)."""

    tokens: list[int] = attrs.field(factory=list)
    first_s: float = 0.0
    last_s: float = 0.0


async def _one(engine: Engine, prompt: str, params: SamplingParams, out: list[_Stream]) -> None:
    stream = _Stream()
    async for delta in engine.generate(chat(prompt), params):
        if delta.token_ids and not stream.tokens:
            stream.first_s = time.perf_counter()
        stream.tokens.extend(delta.token_ids)
    stream.last_s = time.perf_counter()
    out.append(stream)


@attrs.frozen
class Run:
    """One run: tok/s over its wall time, this process's CPU ms per token, each request's tokens (sorted), the
    median time to first token, and the decode rate: each stream's tokens after its first over the time from its
    first token to its last, summed over the streams (what speculation speeds up; the prompt's prefill is not)."""

    tok_s: float
    cpu_ms_per_token: float
    outputs: list
    ttft_ms: float = 0.0
    decode_tok_s: float = 0.0


async def measure_run(
    engine: Engine, streams: int, max_tokens: int, first_prompt: int, temperature: float = 0.0
) -> Run:
    """``streams`` requests at once (greedy, or sampled unseeded at ``temperature``). CPU time counts every thread
    of this process (the MLX thread's work included): unlike wall time it barely moves when other processes load
    the machine."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    done: list[_Stream] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    async with trio.open_nursery() as nursery:
        for prompt in bench_prompts(streams, first_prompt):
            nursery.start_soon(_one, engine, prompt, params, done)
    elapsed, cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    num_tokens = sum(len(s.tokens) for s in done)
    decode = sum((len(s.tokens) - 1) / (s.last_s - s.first_s) for s in done if s.last_s > s.first_s)
    ttft_ms = statistics.median(1000 * (s.first_s - started) for s in done)
    return Run(num_tokens / elapsed, 1000 * cpu_s / num_tokens, sorted(s.tokens for s in done), ttft_ms, decode)


def _configs(cfg: EngineConfig, draft_model: str, num_draft_tokens: int) -> tuple[EngineConfig, EngineConfig]:
    # "auto" (the default) and "vlm" stay: a vision-language model is then measured in the vlm runner, with
    # speculation in the vlm-speculative one; any other mode: the batched runner
    mode = cfg.engine.mode if cfg.engine.mode in ("auto", "vlm") else "batched"
    batched = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode=mode))
    off = attrs.evolve(batched, speculative=attrs.evolve(cfg.speculative, method="off"))
    method = "mtp" if cfg.speculative.method == "mtp" else "draft"  # --set speculative.method=mtp: the MTP head
    on = attrs.evolve(
        batched,
        speculative=attrs.evolve(
            cfg.speculative, method=method, draft_model=draft_model, num_draft_tokens=num_draft_tokens
        ),
    )
    return off, on


async def measure_speculative(
    cfg: EngineConfig,
    *,
    draft_model: str,
    num_draft_tokens: int = 4,
    runs: int = 3,
    max_tokens: int = 128,
    levels: tuple[int, ...] = DEFAULT_LEVELS,
    sampled_temperature: float = 0.0,
) -> list[dict]:
    """One greedy row per level, and with ``sampled_temperature`` > 0 a sampled 1-stream row: off and on tok/s
    (median, min-max), speedup, acceptance; greedy outputs must agree."""
    off_cfg, on_cfg = _configs(cfg, draft_model, num_draft_tokens)
    settings = [(streams, 0.0) for streams in levels]
    if sampled_temperature > 0:
        settings.append((1, sampled_temperature))
    rows = []
    async with open_engine(off_cfg) as off, open_engine(on_cfg) as on:
        for streams, temperature in settings:
            for engine in (off, on):  # warm-up
                await measure_run(engine, streams, max_tokens, 0, temperature)
            measured: dict[str, list[Run]] = {"off": [], "on": []}
            before = on.metrics.spec_decode
            for run in range(runs):
                first = 1 + run * streams  # fresh prompts each run, the same for both settings
                measured["off"].append(await measure_run(off, streams, max_tokens, first, temperature))
                measured["on"].append(await measure_run(on, streams, max_tokens, first, temperature))
            rows.append(_row(streams, temperature, measured, _since(before, on.metrics.spec_decode)))
    return rows


def _since(before: SpecDecodeCounts, after: SpecDecodeCounts) -> SpecDecodeCounts:
    return SpecDecodeCounts(
        num_drafts=after.num_drafts - before.num_drafts,
        num_draft_tokens=after.num_draft_tokens - before.num_draft_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
    )


def _row(streams: int, temperature: float, measured: dict[str, list[Run]], counts: SpecDecodeCounts) -> dict:
    off_tok_s, on_tok_s = [r.tok_s for r in measured["off"]], [r.tok_s for r in measured["on"]]
    off_cpu, on_cpu = [r.cpu_ms_per_token for r in measured["off"]], [r.cpu_ms_per_token for r in measured["on"]]
    paired = [b / a for a, b in zip(off_tok_s, on_tok_s, strict=True)]
    identical = all(a.outputs == b.outputs for a, b in zip(measured["off"], measured["on"], strict=True))
    rate, length = counts.acceptance_rate, counts.mean_accepted_length
    return {
        "streams": streams,
        "temperature": f"{temperature:g}",
        "off_tok_s": _spread(off_tok_s),
        "on_tok_s": _spread(on_tok_s),
        "speedup": f"{statistics.median(on_tok_s) / statistics.median(off_tok_s):.2f}",
        "paired_speedup": _spread(paired, 2),
        "off_cpu_ms_tok": _spread(off_cpu),
        "on_cpu_ms_tok": _spread(on_cpu),
        "cpu_speedup": f"{statistics.median(off_cpu) / statistics.median(on_cpu):.2f}",
        "off_ttft_ms": _spread([r.ttft_ms for r in measured["off"]], 0),
        "on_ttft_ms": _spread([r.ttft_ms for r in measured["on"]], 0),
        "decode_speedup": _spread(
            [b.decode_tok_s / a.decode_tok_s for a, b in zip(measured["off"], measured["on"], strict=True)], 2
        ),
        "acceptance": "-" if rate is None else f"{rate:.3f}",
        "tokens_per_round": "-" if length is None else f"{length:.2f}",
        "rounds": counts.num_drafts,
        "identical": "-" if temperature > 0 else "yes" if identical else "NO",
    }


def _spread(values: list[float], digits: int = 1) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
