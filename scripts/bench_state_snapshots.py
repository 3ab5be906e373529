"""What snapshots of sliding-window / recurrent layers at block boundaries cost and give.

Run from the repository root: PYTHONPATH=.:tests/prefix .venv/bin/python scripts/bench_state_snapshots.py
For qwen3_next (linear attention) and gemma3_text (sliding window) models wider than the test
zoo's (hidden 256, 8 layers, float32, random weights, the demo tokenizer), batched mode,
block_size 64: per ``cache.state_snapshot_blocks`` value, the cold TTFT of a ~1,000-token chat
prompt, the TTFT and cached tokens of a second prompt with the same system prompt and another
question, and the bytes of a snapshot against a full block. Medians of 3, values alternated.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time

import prefix_zoo
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.demo.model import build_demo_model

VALUES = (0, 1, 4, 16)
RUNS = 3
PARAMS = SamplingParams(temperature=0.0, max_tokens=1)
WIDER = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8, "head_dim": 64}


async def one(engine, prompt) -> tuple[float, int]:
    t0 = time.perf_counter()
    with await engine.submit(prompt, PARAMS) as stream:
        async for _ in stream:
            break
        async for _ in stream:
            pass
    return time.perf_counter() - t0, stream.usage.cached_tokens


async def measure(model_dir: str, blocks: int, system: str, run: int) -> dict:
    cfg = load_config(
        None,
        overrides=[
            f"model.path={model_dir}",
            "engine.mode=batched",
            "cache.block_size=64",
            f"cache.state_snapshot_blocks={blocks}",
        ],
        environ={},
    )
    async with open_engine(cfg) as engine:
        salt = f"run {run}: "
        cold, _ = await one(
            engine, [{"role": "system", "content": salt + system}, {"role": "user", "content": "What is the sea?"}]
        )
        warm, cached = await one(
            engine,
            [{"role": "system", "content": salt + system}, {"role": "user", "content": "Why are the stars far away?"}],
        )
        pool = engine._cache.pool
        infos = [pool.block_info(b) for b in range(pool.next_id) if b in pool]
        tails = [i.nbytes for i in infos if pool.is_tail(i.block_id) and i.nbytes]
        full = [i.nbytes for i in infos if not pool.is_tail(i.block_id)]
    return {"cold": cold, "warm": warm, "cached": cached, "snap": max(tails, default=0), "block": max(full, default=0)}


def main() -> None:
    root = pathlib.Path(tempfile.mkdtemp())
    tok_dir = build_demo_model(root / "tok", size="tiny", dtype="float32")
    words = (pathlib.Path("vllm_mlx_trio/data/corpus.txt")).read_text().split()
    system = " ".join(words[:700])
    for arch in ("qwen3_next", "gemma3_text"):
        prefix_zoo._COMMON.update(WIDER)
        model_dir = str(prefix_zoo.build_model(arch, root / arch, pathlib.Path(tok_dir)))
        results: dict[int, list[dict]] = {v: [] for v in VALUES}
        for run in range(RUNS):
            for value in VALUES:
                results[value].append(trio.run(measure, model_dir, value, system, run))
        print(
            f"\n{arch}: | state_snapshot_blocks | cold TTFT ms | shared-prefix TTFT ms | cached tokens |"
            " snapshot bytes | block bytes |"
        )
        for value, rows in results.items():

            def col(key, rows=rows):
                values = sorted(r[key] for r in rows)
                return values[len(values) // 2], values[0], values[-1]

            cold, warm = col("cold"), col("warm")
            print(
                f"| {value} | {cold[0] * 1e3:.0f} ({cold[1] * 1e3:.0f}-{cold[2] * 1e3:.0f}) | "
                f"{warm[0] * 1e3:.0f} ({warm[1] * 1e3:.0f}-{warm[2] * 1e3:.0f}) | "
                f"{statistics.median(r['cached'] for r in rows):.0f} | "
                f"{rows[0]['snap']:,} | {rows[0]['block']:,} |"
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main()
