"""``vllm-mlx-trio bench state-snapshots``: what snapshots of sliding-window and recurrent
layers at block boundaries (``cache.state_snapshot_blocks``) cost and give.

Each model is an architecture of ``worker/prefix/state_models.py`` (built into a temporary
directory) or a model directory. Per value of ``state_snapshot_blocks``, an engine in batched
mode answers a chat prompt with a long system prompt (cold), then the same system prompt with
another question: that one's TTFT and cached tokens are the reuse the snapshots allow. The
largest snapshot's bytes are set against a full block's. The values alternate within each
run and every run salts the system prompt anew; medians (min-max) of the runs.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import Engine, open_engine
from .stats import median_spread
from .workload import corpus_text

#: Words of the shared system prompt by default: about 1,800 tokens with the demo tokenizer.
SYSTEM_WORDS = 700
QUESTIONS = ("What is the sea?", "Why are the stars far away?")
PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


def snapshot_cfg(cfg: EngineConfig, model_dir: str, blocks: int, block_size: int) -> EngineConfig:
    """``cfg`` on ``model_dir`` in batched mode, cache on, ``blocks`` blocks between snapshots."""
    cache = attrs.evolve(cfg.cache, enabled=True, block_size=block_size, state_snapshot_blocks=blocks)
    engine = attrs.evolve(cfg.engine, mode="batched")
    return attrs.evolve(cfg, model=attrs.evolve(cfg.model, path=model_dir), engine=engine, cache=cache)


async def _first_token(engine: Engine, messages: list[dict]) -> tuple[float, int]:
    """Seconds to the first token of a one-token request, and its cached tokens."""
    start = time.perf_counter()
    ttft = None
    async with engine.open_request(messages, PARAMS) as stream:
        async for _delta in stream:
            if ttft is None:
                ttft = time.perf_counter() - start
    return ttft if ttft is not None else time.perf_counter() - start, stream.usage.cached_tokens


def _stored_bytes(engine: Engine) -> tuple[int, int]:
    """The largest snapshot's bytes and the largest full block's, in the engine's pool. A
    snapshot is a tail of no tokens (one at a block boundary); the checkpoint at a prompt's end
    holds the tokens past its last full block."""
    infos = engine.prefix_blocks()
    snapshots = [i.nbytes for i in infos if i.is_tail and i.num_tokens == 0]
    blocks = [i.nbytes for i in infos if not i.is_tail]
    return max(snapshots, default=0), max(blocks, default=0)


async def measure_once(cfg: EngineConfig, system: str) -> dict:
    """The cold prompt, then the shared-prefix one, on a fresh engine."""
    async with open_engine(cfg) as engine:
        prompts = [[{"role": "system", "content": system}, {"role": "user", "content": q}] for q in QUESTIONS]
        cold, _ = await _first_token(engine, prompts[0])
        shared, cached = await _first_token(engine, prompts[1])
        snapshot, block = _stored_bytes(engine)
    return {"cold_s": cold, "shared_s": shared, "cached": cached, "snapshot_bytes": snapshot, "block_bytes": block}


def measure_model(
    cfg: EngineConfig,
    model_dir: str,
    *,
    values: tuple[int, ...],
    runs: int,
    block_size: int,
    system_words: int = SYSTEM_WORDS,
) -> dict[int, list[dict]]:
    """value -> one measurement per run; the values alternate within each run."""
    results: dict[int, list[dict]] = {value: [] for value in values}
    for run in range(runs):
        system = f"Run {run} at {time.monotonic_ns() % 9973}: {corpus_text(system_words)}"
        for value in values:
            value_cfg = snapshot_cfg(cfg, model_dir, value, block_size)
            results[value].append(trio.run(measure_once, value_cfg, system))
    return results


def snapshot_rows(results: dict[int, list[dict]]) -> list[dict]:
    """One row per value: TTFTs in ms, median (min-max); cached tokens median; bytes."""
    rows = []
    for value, runs in results.items():
        rows.append(
            {
                "state_snapshot_blocks": value,
                "cold_ttft_ms": median_spread([r["cold_s"] * 1000 for r in runs], 0),
                "shared_prefix_ttft_ms": median_spread([r["shared_s"] * 1000 for r in runs], 0),
                "cached_tokens": round(statistics.median(r["cached"] for r in runs)),
                "snapshot_bytes": max(r["snapshot_bytes"] for r in runs) or None,
                "block_bytes": max(r["block_bytes"] for r in runs),
            }
        )
    return rows


def resolve_models(cfg: EngineConfig, names: list[str], scratch: pathlib.Path) -> list[tuple[str, str]]:
    """(label, directory) per name: an architecture is built under ``scratch`` (with
    ``demo:tiny``'s tokenizer, from ``cfg``'s demo cache), else a path."""
    from ..worker.loading import resolve_model_path
    from ..worker.prefix.state_models import ARCHITECTURES, build_state_model

    tokenizer_dir = pathlib.Path(resolve_model_path(attrs.evolve(cfg.model, path="demo:tiny")))
    models = []
    for name in names:
        if name in ARCHITECTURES:
            models.append((name, str(build_state_model(name, scratch / name, tokenizer_dir))))
        else:
            models.append((name, name))
    return models


def run_state_snapshots_command(cfg: EngineConfig, args: argparse.Namespace) -> int:
    """Measure every model, print a table each, and write ``--json`` when given."""
    from .machine import machine_info
    from .report import format_section, write_json

    names = [n.strip() for n in args.models.split(",") if n.strip()]
    payload: dict = {"kind": "state-snapshots", "block_size": args.block_size, "models": {}}
    with tempfile.TemporaryDirectory(prefix="state-snapshots-") as scratch:
        for label, model_dir in resolve_models(cfg, names, pathlib.Path(scratch)):
            results = measure_model(
                cfg,
                model_dir,
                values=args.values,
                runs=args.runs,
                block_size=args.block_size,
                system_words=args.system_words,
            )
            rows = snapshot_rows(results)
            notes = [
                f"batched, block_size {args.block_size}; a {args.system_words}-word system prompt, then the same with "
                "another question (one token each); median (min-max) of the runs, values alternated",
            ]
            machine = machine_info()
            print(format_section(f"state snapshots: {label}", rows, machine, notes), flush=True)
            payload["models"][label] = {"rows": rows, "runs": results}
    payload["machine"] = machine_info()
    if args.json_path:
        write_json(args.json_path, payload)
    return 0
