"""Two ranks on loopback (ring backend), tensor-parallel over the float32 demo model: greedy
output identical to one process (batched, cancelled, prefix-cached), and a rank killed
mid-stream gives rank 0's client an in-band error and rank 0 exit 1."""

from __future__ import annotations

import contextlib
import json
import pathlib
import sys

import httpx
import pytest
import trio
from replicas import REPO, Process, replica, subprocess_env, wait_ready

from vllm_mlx_trio.testing.harness import free_port

pytestmark = pytest.mark.mlx
PROMPTS = ["hello there", "the quick brown fox jumps", "one two three four five six seven"]


@contextlib.asynccontextmanager
async def two_ranks(tmp_path: pathlib.Path, model_dir: str, *overrides: str):
    """Rank 0 (HTTP) and rank 1 (follower), started as ``mlx.launch --backend ring`` would:
    a hostfile of loopback addresses, ``MLX_RANK`` per process. Always killed at the end."""
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    port = free_port()
    sets = [
        f"server.port={port}", f"model.path={model_dir}", "engine.mode=distributed", "distributed.backend=ring",
        "cache.block_size=16", *overrides,
    ]
    argv = [sys.executable, "-m", "vllm_mlx_trio.cli", "serve", *[a for s in sets for a in ("--set", s)]]
    ranks = []
    try:
        for rank in (0, 1):
            env = {**subprocess_env(), "MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
            log = tmp_path / f"rank{rank}.log"
            with log.open("wb") as out:
                proc = await trio.lowlevel.open_process(argv, cwd=REPO, env=env, stdout=out, stderr=out)
            ranks.append(Process(proc, f"http://127.0.0.1:{port}", log))
        await wait_ready(ranks[0], "/health")
        yield ranks
    finally:
        for process in ranks:
            if process.proc.returncode is None:
                process.proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await process.proc.wait()


async def answers(url: str, model: str) -> list:
    """Greedy completions: three at once (batched), one cancelled mid-stream, one repeated
    (the repeat's prompt comes from the prefix cache), and a seeded sampled one."""
    async with httpx.AsyncClient(timeout=60) as http:

        async def complete(prompt: str, **fields) -> dict:
            body = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0, **fields}
            resp = await http.post(f"{url}/v1/completions", json=body)
            assert resp.status_code == 200, resp.text
            return resp.json()

        results: dict[str, str] = {}

        async def one(prompt: str) -> None:
            results[prompt] = (await complete(prompt))["choices"][0]["text"]

        async with trio.open_nursery() as nursery:
            for prompt in PROMPTS:
                nursery.start_soon(one, prompt)
        body = {"model": model, "prompt": "cancel me", "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    break  # the client leaves after the first chunk: the request is aborted
        long_prompt = " ".join(PROMPTS) * 4
        first, repeat = await complete(long_prompt), await complete(long_prompt)
        seeded = await complete("seeded", temperature=0.9, seed=11)
    assert repeat["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    texts = [results[p] for p in PROMPTS]
    return [*texts, first["choices"][0]["text"], repeat["choices"][0]["text"], seeded["choices"][0]["text"]]


async def test_two_ranks_tensor_parallel_match_one_process(tmp_path, float32_dir, demo_cache_dir):
    with trio.fail_after(300):
        async with two_ranks(tmp_path, float32_dir) as (rank0, _rank1):
            sharded = await answers(rank0.url, float32_dir)
        async with replica(tmp_path, demo_cache_dir, f"model.path={float32_dir}") as single:
            reference = await answers(single.url, float32_dir)
    assert sharded == reference
    assert "loaded its shard; following rank 0" in _rank1.output()


async def test_rank_killed_mid_stream_gives_an_in_band_error_and_exit_1(tmp_path, float32_dir):
    with trio.fail_after(300):
        stall = ("limits.engine_stall_timeout_s=3", "distributed.collective_timeout_s=20")
        async with two_ranks(tmp_path, float32_dir, *stall) as (rank0, rank1), httpx.AsyncClient(timeout=60) as http:
            body = {"model": float32_dir, "prompt": "long", "max_tokens": 1500, "ignore_eos": True, "stream": True}
            events = []
            async with http.stream("POST", f"{rank0.url}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    events.append(line[6:])
                    if len(events) == 3:
                        rank1.proc.kill()
            code = await rank0.proc.wait()
    assert json.loads(events[-1])["error"]["type"] in ("engine_unavailable", "server_error"), events[-3:]
    assert code == 1, rank0.output()[-2000:]
