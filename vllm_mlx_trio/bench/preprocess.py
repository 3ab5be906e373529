"""``vllm-mlx-trio bench preprocess``: do other streams stall while a huge prompt is admitted?

Eight greedy streams run; once each has produced tokens, one chat request with a prompt of
about 32k tokens is submitted. Its template and tokenizer run on the event loop with
``limits.preprocess_threads = 0`` (the old inline path) and in a thread with 1. The table gives
the inter-token latency (gap between two deltas of one stream) of the eight streams during
the window from the big submit until its answer (admitted, or refused when the model's
context is smaller, which still needs the whole prompt tokenized), and the longest gap. A
third row measures the streams alone (no big prompt) for comparison. Runs alternate between
the paths; each row gives the median of its runs and their spread (min-max).
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from ..errors import InvalidRequestError
from .stats import percentile, runs_spread
from .workload import bench_prompts, chat

#: Streams running while the big prompt is admitted.
NUM_STREAMS = 8
#: Tokens of the big prompt (the default of ``--prompt-tokens``).
BIG_PROMPT_TOKENS = 32_768
#: Settings compared: inline on the event loop (before), one preprocessing thread (after).
SETTINGS = (0, 1)
#: Seconds of steady streaming before the big prompt, and measured after its answer.
SETTLE_S = 0.5
#: The measured window of the baseline run (no big prompt): about a big prompt's admission.
BASELINE_WINDOW_S = 0.25


async def big_prompt(engine: Engine, num_tokens: int) -> list[dict]:
    """One user turn of about ``num_tokens`` tokens (counted with the model's tokenizer)."""
    unit = " ".join(bench_prompts(8))
    per_unit = len(await trio.to_thread.run_sync(engine.model_info.tokenizer.encode, unit))
    return chat(unit * max(1, num_tokens // max(1, per_unit)))


async def _stream(engine: Engine, prompt: list[dict], arrivals: list[float], started: trio.Event) -> None:
    """Stream until cancelled (at most the room left in the context), noting when each delta arrives."""
    params = SamplingParams(temperature=0.0, ignore_eos=True)
    async for _delta in engine.generate(prompt, params):
        arrivals.append(trio.current_time())
        if len(arrivals) == 4:
            started.set()


async def _admit_big(engine: Engine, prompt: list[dict]) -> str:
    try:
        async with engine.open_request(prompt, SamplingParams(max_tokens=1)):
            return "admitted"
    except InvalidRequestError as exc:
        return f"refused ({exc.code})"


async def measure_once(engine: Engine, prompt: list[dict] | None) -> dict:
    """One run: the streams' gaps while the big prompt is submitted and answered (None: no
    prompt, a window of :data:`BASELINE_WINDOW_S`, for the streams' own ITL)."""
    arrivals: list[list[float]] = [[] for _ in range(NUM_STREAMS)]
    async with trio.open_nursery() as nursery:
        started = [trio.Event() for _ in range(NUM_STREAMS)]
        for i, text in enumerate(bench_prompts(NUM_STREAMS)):
            nursery.start_soon(_stream, engine, chat(text), arrivals[i], started[i])
        for event in started:
            await event.wait()
        await trio.sleep(SETTLE_S)
        begin = trio.current_time()
        if prompt is None:
            await trio.sleep(BASELINE_WINDOW_S)
            outcome = "none"
        else:
            outcome = await _admit_big(engine, prompt)
        end = trio.current_time()
        await trio.sleep(SETTLE_S)
        nursery.cancel_scope.cancel()
    gaps = [b - a for times in arrivals for a, b in zip(times, times[1:], strict=False) if b > begin and a < end]
    return {
        "window_s": end - begin,
        "itl_p95_ms": percentile(gaps, 95) * 1000 if gaps else None,
        "max_gap_ms": max(gaps) * 1000 if gaps else None,
        "outcome": outcome,
    }


def _with_threads(cfg: EngineConfig, threads: int) -> EngineConfig:
    return attrs.evolve(cfg, limits=attrs.evolve(cfg.limits, preprocess_threads=threads))


async def measure_preprocess(
    cfg: EngineConfig, runs: int = 3, num_tokens: int = BIG_PROMPT_TOKENS, *, executor_factory: Any = None
) -> list[dict]:
    """Alternating runs of each path; one row per path (medians, min-max spread): inline, in a
    thread, and the streams alone (the threaded engine, no big prompt)."""
    inline_cfg, threaded_cfg = _with_threads(cfg, SETTINGS[0]), _with_threads(cfg, SETTINGS[1])
    async with (
        open_engine(inline_cfg, executor_factory=executor_factory) as inline,
        open_engine(threaded_cfg, executor_factory=executor_factory) as threaded,
    ):
        prompt = await big_prompt(inline, num_tokens)
        paths = {
            f"inline (preprocess_threads={SETTINGS[0]})": (inline, prompt),
            f"thread (preprocess_threads={SETTINGS[1]})": (threaded, prompt),
            "no big prompt (baseline)": (threaded, None),
        }
        results: dict[str, list[dict]] = {path: [] for path in paths}
        for _run in range(runs):
            for path, (engine, big) in paths.items():
                results[path].append(await measure_once(engine, big))
    return [_row(path, results[path], len(prompt[0]["content"])) for path in paths]


def _row(path: str, runs: list[dict], prompt_chars: int) -> dict:
    return {
        "path": path,
        "runs": len(runs),
        "prompt_chars": prompt_chars if runs[0]["outcome"] != "none" else 0,
        "itl_p95_ms": runs_spread(runs, "itl_p95_ms"),
        "max_gap_ms": runs_spread(runs, "max_gap_ms"),
        "window_s": runs_spread(runs, "window_s", 2),
        "big_prompt": runs[0]["outcome"],
    }
