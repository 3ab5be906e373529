"""Two ranks on loopback (ring backend), tensor-parallel over the float32 demo model: every
request kind (structured, forced tool, processors, logprobs, n > 1, stop strings, seeds;
batched, cancelled, prefix-cached) answers as one process does, and a rank killed mid-stream
gives rank 0's client an in-band error and rank 0 exit 1."""

from __future__ import annotations

import contextlib
import functools
import json
import pathlib
import shutil
import sys

import attrs
import httpx
import pytest
import trio
from replicas import REPO, Process, replica, subprocess_env, wait_ready

from vllm_mlx_trio.testing.harness import free_port

pytestmark = pytest.mark.mlx
PROMPTS = ["hello there", "the quick brown fox jumps", "one two three four five six seven"]


@contextlib.asynccontextmanager
async def two_ranks(tmp_path: pathlib.Path, model_dir: str, *overrides: str, ready: bool = True):
    """Rank 0 (HTTP) and rank 1 (follower), started as ``mlx.launch --backend ring`` would:
    a hostfile of loopback addresses, ``MLX_RANK`` per process; rank 0 answering /health first
    when ``ready``. Always killed at the end."""
    hostfile = tmp_path / "ring.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    port = free_port()
    sets = [
        f"server.port={port}",
        f"model.path={model_dir}",
        "engine.mode=distributed",
        "distributed.backend=ring",
        "cache.block_size=16",
        *overrides,
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
        if ready:
            await wait_ready(ranks[0], "/health")
        yield ranks
    finally:
        for process in ranks:
            if process.proc.returncode is None:
                process.proc.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                await process.proc.wait()


#: A forced tool call: its arguments are generated under the grammar compiled from this schema.
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
PLACE = {"type": "object", "properties": {"name": {"type": "string"}, "rank": {"type": "integer"}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@attrs.frozen
class Answers:
    """What one server answered: texts (and tool calls) that must be equal to one process's,
    and the logprobs, equal within float rounding (the shards sum in another order)."""

    texts: dict
    logprobs: list


async def answers(url: str, model: str) -> Answers:
    """Every request kind: a structured one and a forced tool call first (a compiled grammar in
    the plan ended a sharded server), then greedy completions three at once (batched) beside
    a constrained one (guided_choice), one cancelled mid-stream, one repeated (the repeat's
    prompt comes from the prefix cache), logits processors (logit_bias, min_tokens,
    penalties), logprobs, n > 1 seeded, stop strings, seeded and unseeded sampling."""
    texts: dict = {}
    async with httpx.AsyncClient(timeout=60) as http:

        async def post(path: str, body: dict) -> dict:
            resp = await http.post(f"{url}{path}", json={"model": model, "temperature": 0, **body})
            assert resp.status_code == 200, resp.text
            return resp.json()

        async def complete(prompt: str, **fields) -> dict:
            return await post("/v1/completions", {"prompt": prompt, "max_tokens": 16, **fields})

        async def text(key: str, prompt: str, **fields) -> None:
            texts[key] = [c["text"] for c in (await complete(prompt, **fields))["choices"]]

        schema = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE, "strict": True}}
        structured = await post("/v1/chat/completions", {"messages": ASK, "max_tokens": 24, "response_format": schema})
        texts["structured"] = structured["choices"][0]["message"]["content"]
        forced = {"type": "function", "function": {"name": "get_weather"}}
        tool = await post(
            "/v1/chat/completions", {"messages": ASK, "tools": [WEATHER], "tool_choice": forced, "max_tokens": 40}
        )
        calls = tool["choices"][0]["message"]["tool_calls"]
        texts["tool"] = [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        async with trio.open_nursery() as nursery:
            for prompt in PROMPTS:
                nursery.start_soon(text, prompt, prompt)
            nursery.start_soon(functools.partial(text, "choice", "pick one", guided_choice=["red", "green", "blue"]))
        body = {"model": model, "prompt": "cancel me", "max_tokens": 200, "ignore_eos": True, "stream": True}
        async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    break  # the client leaves after the first chunk: the request is aborted
        long_prompt = " ".join(PROMPTS) * 4
        first, repeat = await complete(long_prompt), await complete(long_prompt)
        assert repeat["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        texts["long"] = [first["choices"][0]["text"], repeat["choices"][0]["text"]]
        penalties = {"presence_penalty": 1.5, "frequency_penalty": 0.5, "repetition_penalty": 1.3}
        await text("processors", "hello there", logit_bias={"5": 30}, min_tokens=12, **penalties)
        await text("stop", "the quick brown fox jumps", stop=[texts[PROMPTS[1]][0][2:4] or "e"])
        await text("n", "seeded", n=2, temperature=0.9, seed=11)
        await text("seeded", "seeded", temperature=1.0, top_k=20, top_p=0.9, min_p=0.05, seed=3)
        with_logprobs = await complete("one two three", logprobs=3)
        unseeded = await complete("anything", temperature=1.0, n=2)
        assert len(unseeded["choices"]) == 2
        assert (await http.get(f"{url}/health")).status_code == 200
    lp = with_logprobs["choices"][0]["logprobs"]
    texts["logprobs"] = [with_logprobs["choices"][0]["text"], lp["tokens"], [sorted(t) for t in lp["top_logprobs"]]]
    values = [*lp["token_logprobs"], *(v for top in lp["top_logprobs"] for v in top.values())]
    return Answers(texts, values)


def same_answers(sharded: Answers, single: Answers) -> None:
    assert sharded.texts == single.texts
    assert sharded.logprobs == pytest.approx(single.logprobs, abs=1e-3)
    assert sharded.texts["structured"].startswith("{")  # the grammar held (max_tokens may cut it)
    assert sharded.texts["choice"][0] in ("red", "green", "blue")
    assert [name for name, _ in sharded.texts["tool"]] == ["get_weather"]


async def test_two_ranks_tensor_parallel_match_one_process(tmp_path, float32_dir, demo_cache_dir):
    with trio.fail_after(300):
        async with two_ranks(tmp_path, float32_dir) as (rank0, _rank1):
            sharded = await answers(rank0.url, float32_dir)
        async with replica(tmp_path, demo_cache_dir, f"model.path={float32_dir}") as single:
            reference = await answers(single.url, float32_dir)
    same_answers(sharded, reference)
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


async def test_a_vision_checkpoint_is_refused_at_load_and_both_ranks_exit_1(tmp_path, float32_dir):
    model = tmp_path / "vision"
    shutil.copytree(float32_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vision_config": {"model_type": "qwen2_vl"}}))
    with trio.fail_after(120):
        async with two_ranks(tmp_path, str(model), ready=False) as ranks:
            codes = [await rank.proc.wait() for rank in ranks]
    assert codes == [1, 1], [rank.output()[-2000:] for rank in ranks]
    for rank in ranks:
        assert "is a vision-language model" in rank.output()


async def _race(url: str, model: str, low: dict, high: dict) -> tuple[list[str], dict[str, str]]:
    """``low`` streaming in the one slot, then ``high``: the order they finished, and their texts."""
    order: list[str] = []
    texts: dict[str, str] = {}
    async with httpx.AsyncClient(timeout=120) as http:

        async def run_high() -> None:
            resp = await http.post(f"{url}/v1/completions", json={"model": model, **high})
            assert resp.status_code == 200, resp.text
            texts["high"] = resp.json()["choices"][0]["text"]
            order.append("high")

        async with trio.open_nursery() as nursery:
            chunks: list[str] = []
            body = {"model": model, **low, "stream": True}
            async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: {"):
                        if not chunks:
                            nursery.start_soon(run_high)  # arrives while low holds the only slot
                        chunks.append(json.loads(line[6:])["choices"][0]["text"])
            texts["low"] = "".join(chunks)
            order.append("low")
    return order, texts


async def test_priority_preempts_on_two_ranks_and_outputs_stay_exact(tmp_path, float32_dir, demo_cache_dir):
    low = {"prompt": "a long story", "max_tokens": 64, "ignore_eos": True, "temperature": 0.8, "seed": 5, "priority": 5}
    high = {"prompt": "quick", "max_tokens": 8, "temperature": 0, "priority": -5}
    with trio.fail_after(300):
        async with two_ranks(tmp_path, float32_dir, "engine.max_num_seqs=1") as (rank0, _rank1):
            order, texts = await _race(rank0.url, float32_dir, low, high)
            async with httpx.AsyncClient() as http:
                metrics = (await http.get(f"{rank0.url}/metrics")).text
        async with replica(tmp_path, demo_cache_dir, f"model.path={float32_dir}") as single:
            async with httpx.AsyncClient(timeout=120) as http:
                solo = {}
                for name, body in (("low", low), ("high", high)):
                    resp = await http.post(f"{single.url}/v1/completions", json={"model": float32_dir, **body})
                    solo[name] = resp.json()["choices"][0]["text"]
    assert order == ["high", "low"]
    assert texts == solo
    preempted = [line for line in metrics.splitlines() if line.startswith("vllm:num_preemptions_total")]
    assert preempted and float(preempted[0].split()[-1]) >= 1
