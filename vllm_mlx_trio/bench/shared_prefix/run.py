"""``vllm-mlx-trio bench shared-prefix``: N rows sharing a P-token system prompt, sharing it in the batch or not.

Two engines on the same model are loaded side by side, ``cache.share_prefix_in_batch`` false and true (batched
mode, the prefix cache on). For each system prompt length P and row count N, each engine first runs one request
with that system prompt (its blocks enter the prefix store, as a system prompt every client sends would), then a
run is N greedy requests with the system prompt and distinct questions started together. Settings alternate, off
then on, for ``runs`` rounds after a warm-up each, so load drift hits both alike. Per run: the most KV bytes the
running batch's layers held (measured on the runner after each step), aggregate tok/s (all tokens over the wall
time), the decode step (median over the streams of their time between tokens after the first) and the median time
to first token; outputs must be the same tokens on and off.
"""

from __future__ import annotations

import statistics
import time

import attrs
import trio

from ...actors.executor import keeping_runners
from ...config import EngineConfig
from ...core.params import SamplingParams
from ...engine import Engine, open_engine
from ..workload import corpus_text

DEFAULT_MODEL = "demo:small"
DEFAULT_ROWS = (1, 4, 8, 16)
DEFAULT_PREFIX_TOKENS = (512, 2048, 8192)


@attrs.frozen
class Run:
    tok_s: float
    step_ms: float
    ttft_ms: float
    kv_bytes: int
    outputs: list


def system_prompt(tokenizer, num_tokens: int) -> str:
    """Corpus text of about ``num_tokens`` tokens (a system prompt)."""
    words = max(1, num_tokens * 3 // 4)
    while len(tokenizer.encode(corpus_text(words))) < num_tokens:
        words += max(1, words // 20)
    while len(tokenizer.encode(corpus_text(words))) > num_tokens and words > 1:
        words -= 1
    return corpus_text(words)


def messages(system: str, question: int) -> list[dict]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Question {question}: what does part {question * 7 + 3} of the text say?"},
    ]


async def _one(engine: Engine, prompt: list[dict], params: SamplingParams, out: list) -> None:
    tokens: list[int] = []
    started, first, last = time.perf_counter(), 0.0, 0.0
    async for delta in engine.generate(prompt, params):
        if delta.token_ids and not tokens:
            first = time.perf_counter()
        tokens.extend(delta.token_ids)
        last = time.perf_counter()
    step = (last - first) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
    out.append((tokens, first - started, step))


async def measure_run(engine: Engine, sharing, system: str, rows: int, first: int, max_tokens: int) -> Run:
    """``rows`` requests with ``system`` and questions ``first ..`` started together."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    done: list = []
    sharing.take_peak()
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(rows):
            nursery.start_soon(_one, engine, messages(system, first + i), params, done)
    elapsed = time.perf_counter() - started
    kv_bytes, _saved = sharing.take_peak()
    return Run(
        tok_s=sum(len(t) for t, _, _ in done) / elapsed,
        step_ms=1000 * statistics.median(s for _, _, s in done),
        ttft_ms=1000 * statistics.median(f for _, f, _ in done),
        kv_bytes=kv_bytes,
        outputs=sorted(t for t, _, _ in done),
    )


def _config(cfg: EngineConfig, share: bool) -> EngineConfig:
    return attrs.evolve(
        cfg,
        engine=attrs.evolve(cfg.engine, mode="batched", max_num_seqs=max(cfg.engine.max_num_seqs, max(DEFAULT_ROWS))),
        cache=attrs.evolve(cfg.cache, enabled=True, share_prefix_in_batch=share),
    )


def _capturing(cfg: EngineConfig, runners: list):
    from ...worker.batched.runner import BatchRunner  # imports mlx

    return keeping_runners(lambda request_waiting: BatchRunner(cfg, request_waiting=request_waiting), runners)


async def measure_shared_prefix(
    cfg: EngineConfig,
    *,
    rows: tuple[int, ...] = DEFAULT_ROWS,
    prefix_tokens: tuple[int, ...] = DEFAULT_PREFIX_TOKENS,
    runs: int = 3,
    max_tokens: int = 32,
) -> tuple[list[dict], list[str]]:
    """One table row per (P, N): off and on KV bytes, step time, tok/s and TTFT (medians), their ratios; and notes
    (prefix lengths the model's context cannot hold, the model's sharing status)."""
    table, notes = [], []
    off_cfg, on_cfg = _config(cfg, False), _config(cfg, True)
    off_runners: list = []
    on_runners: list = []
    async with (
        open_engine(off_cfg, executor_factory=_capturing(off_cfg, off_runners)) as off,
        open_engine(on_cfg, executor_factory=_capturing(on_cfg, on_runners)) as on,
    ):
        notes.append(f"sharing on the on-engine: {on.model_info.shared_prefix_in_batch}")
        engines = {"off": (off, off_runners[0]._sharing), "on": (on, on_runners[0]._sharing)}
        question = 0
        for p in prefix_tokens:
            if p + 64 + max_tokens > on.model_info.max_context_tokens:
                notes.append(f"P={p} skipped: over the model's context ({on.model_info.max_context_tokens} tokens)")
                continue
            system = system_prompt(on.model_info.tokenizer, p)
            for engine, sharing in engines.values():  # the system prompt's blocks into the store, and a warm-up
                await measure_run(engine, sharing, system, 1, question, 2)
                await measure_run(engine, sharing, system, 2, question + 1, 4)
            question += 3
            for n in rows:
                measured: dict[str, list[Run]] = {"off": [], "on": []}
                for _ in range(runs):
                    for name, (engine, sharing) in engines.items():
                        measured[name].append(await measure_run(engine, sharing, system, n, question, max_tokens))
                    question += n
                table.append(_row(p, n, measured))
    return table, notes


def _row(p: int, n: int, measured: dict[str, list[Run]]) -> dict:
    def median(name: str, field: str) -> float:
        return statistics.median(getattr(r, field) for r in measured[name])

    identical = all(a.outputs == b.outputs for a, b in zip(measured["off"], measured["on"], strict=True))
    mib = 1024 * 1024
    return {
        "prefix": p,
        "rows": n,
        "kv_mib_off": f"{median('off', 'kv_bytes') / mib:.1f}",
        "kv_mib_on": f"{median('on', 'kv_bytes') / mib:.1f}",
        "kv_ratio": f"{median('on', 'kv_bytes') / max(1.0, median('off', 'kv_bytes')):.2f}",
        "step_ms_off": f"{median('off', 'step_ms'):.1f}",
        "step_ms_on": f"{median('on', 'step_ms'):.1f}",
        "step_ratio": f"{median('on', 'step_ms') / max(1e-9, median('off', 'step_ms')):.2f}",
        "tok_s_off": f"{median('off', 'tok_s'):.1f}",
        "tok_s_on": f"{median('on', 'tok_s'):.1f}",
        "tok_s_ratio": f"{median('on', 'tok_s') / max(1e-9, median('off', 'tok_s')):.2f}",
        "ttft_ms_off": f"{median('off', 'ttft_ms'):.0f}",
        "ttft_ms_on": f"{median('on', 'ttft_ms'):.0f}",
        "identical": "yes" if identical else "NO",
    }
