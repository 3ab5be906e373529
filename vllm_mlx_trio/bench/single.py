"""``vllm-mlx-trio bench single``: one streamed request at a time, against mlx-lm's own loop.

Three paths on the same prompts and the same greedy tokens, one after the other: mlx-lm's
``generate_step`` loop (the ceiling, in a child process of its own), our engine in-process
(``open_engine``), and our HTTP server over a real socket (streaming). Figures are medians over the prompts;
the last column is the ratio of decode speed to the ceiling's.
"""

from __future__ import annotations

import statistics
import time

import attrs
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import open_engine
from ..local_server import open_local_server
from .ceiling.process import CeilingProcess
from .http import BenchClient, HttpTarget, open_bench_client, stream_chunks
from .report import format_table as _format_table
from .workload import SEED_PROMPTS

#: The prompts of vllm-mlx's published continuous-batching table.
PROMPTS = SEED_PROMPTS


@attrs.frozen(kw_only=True)
class Timing:
    num_tokens: int
    ttft_s: float
    total_s: float

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first token (the steady decode speed)."""
        return (self.num_tokens - 1) / (self.total_s - self.ttft_s) if self.num_tokens > 1 else 0.0

    @property
    def e2e_tps(self) -> float:
        return self.num_tokens / self.total_s


def _chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


async def _engine_timings(cfg: EngineConfig, max_tokens: int) -> list[Timing]:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    timings = []
    async with open_engine(cfg) as engine:
        for prompt in (PROMPTS[0], *PROMPTS):  # one warm-up
            start, ttft, count = time.perf_counter(), 0.0, 0
            async for delta in engine.generate(_chat(prompt), params):
                if count == 0:
                    ttft = time.perf_counter() - start
                count += len(delta.token_ids)
            timings.append(Timing(num_tokens=count, ttft_s=ttft, total_s=time.perf_counter() - start))
    return timings[1:]


async def _http_timings(cfg: EngineConfig, max_tokens: int) -> list[Timing]:
    cfg = attrs.evolve(cfg, server=attrs.evolve(cfg.server, port=0, drain_timeout_s=1.0))
    timings = []
    async with open_local_server(cfg) as srv, open_bench_client(timeout_s=600.0, max_connections=2) as client:
        target = HttpTarget(base_url=srv.url, model=cfg.model_name)
        for prompt in (PROMPTS[0], *PROMPTS):
            body = {
                "model": cfg.model_name,
                "messages": _chat(prompt),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            timings.append(await _http_one(client, target, body))
    return timings[1:]


async def _http_one(client: BenchClient, target: HttpTarget, body: dict) -> Timing:
    """One streamed request, read by the benches' lean client (its chunks on a worker thread)."""
    start, ttft, usage = time.perf_counter(), 0.0, 0

    def on_chunk(chunk: dict) -> None:
        nonlocal ttft, usage
        if chunk.get("usage"):
            usage = chunk["usage"]["completion_tokens"]
        elif ttft == 0.0 and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            ttft = time.perf_counter() - start

    await stream_chunks(client, target, body, on_chunk)
    return Timing(num_tokens=usage, ttft_s=ttft, total_s=time.perf_counter() - start)


def _row(name: str, timings: list[Timing], ceiling_tps: float) -> dict:
    decode = statistics.median(t.decode_tps for t in timings)
    return {
        "path": name,
        "requests": len(timings),
        "completion_tokens": sum(t.num_tokens for t in timings),
        "ttft_p50_ms": round(1000 * statistics.median(t.ttft_s for t in timings), 1),
        "decode_tok_s": round(decode, 1),
        "e2e_tok_s": round(statistics.median(t.e2e_tps for t in timings), 1),
        "vs_ceiling": round(decode / ceiling_tps, 3) if ceiling_tps else None,
    }


def run_single(cfg: EngineConfig, *, max_tokens: int) -> list[dict]:
    """Run the three paths; return one row per path (the ceiling first)."""
    with CeilingProcess(cfg) as process:
        ceiling = process.single([_chat(p) for p in PROMPTS], num_tokens=max_tokens)
    ceiling_timings = [Timing(num_tokens=len(r.token_ids), ttft_s=r.ttft_s, total_s=r.total_s) for r in ceiling]
    ceiling_tps = statistics.median(t.decode_tps for t in ceiling_timings)
    engine = trio.run(_engine_timings, cfg, max_tokens)
    http = trio.run(_http_timings, cfg, max_tokens)
    return [
        _row("mlx-lm generate_step (ceiling)", ceiling_timings, ceiling_tps),
        _row(f"engine in-process ({cfg.engine.mode})", engine, ceiling_tps),
        _row(f"HTTP stream ({cfg.engine.mode})", http, ceiling_tps),
    ]


def format_table(rows: list[dict]) -> str:
    return _format_table(rows, list(rows[0]))
