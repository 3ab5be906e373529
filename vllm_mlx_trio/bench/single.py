"""``vllm-mlx-trio bench single``: one streamed request at a time, against mlx-lm's own loop.

Three paths on the same prompts and the same greedy tokens, one after the other: mlx-lm's
``generate_step`` loop (the ceiling, in a child process of its own), our engine in-process
(``open_engine``), and our HTTP server over a real socket (streaming). Figures are medians over the prompts;
the last column is the ratio of decode speed to the ceiling's.
"""

from __future__ import annotations

import json
import statistics
import time

import attrs
import httpx
import trio

from ..config import EngineConfig
from ..core.params import SamplingParams
from ..engine import open_engine
from ..local_server import open_local_server
from .ceiling.process import CeilingProcess
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
    async with open_local_server(cfg) as srv, httpx.AsyncClient(timeout=600) as http:
        for prompt in (PROMPTS[0], *PROMPTS):
            body = {
                "model": cfg.model_name,
                "messages": _chat(prompt),
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            timings.append(await _http_one(http, f"{srv.url}/v1/chat/completions", body))
    return timings[1:]


async def _http_one(http: httpx.AsyncClient, url: str, body: dict) -> Timing:
    start, ttft, usage = time.perf_counter(), 0.0, 0
    async with http.stream("POST", url, json=body) as resp:
        async for line in resp.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            elif ttft == 0.0 and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                ttft = time.perf_counter() - start
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
