"""``[model] adapters``: named LoRA adapters over one base, each row of a batch with its own;
greedy output per adapter equal to ``mlx_lm.load(path, adapter_path=...)``'s, alone and mixed in
one batch with base rows and the other adapter's rows; the prefix cache keeps their KV apart."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
import trio
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.errors import InvalidRequestError
from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.demo.adapter import resolve_demo_adapter

pytestmark = pytest.mark.mlx

#: The last is one token: it joins the batch with an empty cache, never through mlx-lm's prompt path.
PROMPTS = ["Hello there, how are", "The sea was calm and", "a"]
ADAPTERS = {"a": "demo:tiny-lora", "b": "demo:tiny-lora-b"}
MAX_TOKENS = 12
TIMEOUT_S = 180


def mlx_lm_greedy(model, tokenizer, prompt: str) -> list[int]:
    steps = generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=MAX_TOKENS, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def expected(demo_cache_dir: str) -> dict[str | None, list[list[int]]]:
    """Each adapter's (and the base's, None) greedy tokens per prompt, mlx-lm loading it alone."""
    base = str(resolve_demo_model("demo:tiny", demo_cache_dir))
    want = {}
    for name, path in (None, None), *ADAPTERS.items():
        folder = None if path is None else str(resolve_demo_adapter(path, demo_cache_dir))
        model, tokenizer = mlx_lm.load(base, adapter_path=folder)
        want[name] = [mlx_lm_greedy(model, tokenizer, p) for p in PROMPTS]
    return want


def adapters_cfg(demo_cache_dir: str, *extra: str):
    table = ", ".join(f'{name} = "{path}"' for name, path in ADAPTERS.items())
    overrides = [
        "model.path=demo:tiny",
        f"model.demo_cache_dir={demo_cache_dir}",
        "engine.mode=batched",
        f"model.adapters={{ {table} }}",
        *extra,
    ]
    return load_config(None, overrides=overrides, environ={})


async def run_all(engine, jobs: list[tuple[str | None, int]]) -> list[tuple[list[int], int]]:
    """Each (adapter, prompt index) submitted at once (one batch): (tokens, cached prompt tokens)."""
    outputs: dict[int, tuple[list[int], int]] = {}

    async def run(i: int, adapter: str | None, prompt: int) -> None:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, adapter=adapter)
        with await engine.submit(PROMPTS[prompt], params) as stream:
            tokens = [t async for delta in stream for t in delta.token_ids]
        outputs[i] = (tokens, stream.usage.cached_tokens)

    async with trio.open_nursery() as nursery:
        for i, (adapter, prompt) in enumerate(jobs):
            nursery.start_soon(run, i, adapter, prompt)
    return [outputs[i] for i in range(len(jobs))]


async def test_each_adapter_alone_and_mixed_in_one_batch_equals_mlx_lm(demo_cache_dir):
    want = expected(demo_cache_dir)
    assert want["a"] != want[None] and want["b"] != want[None] and want["a"] != want["b"]
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(adapters_cfg(demo_cache_dir, "cache.enabled=false")) as engine:
            for adapter in ("a", "b"):  # alone
                ((tokens, _),) = await run_all(engine, [(adapter, 0)])
                assert tokens == want[adapter][0]
            jobs = [(adapter, p) for p in range(len(PROMPTS)) for adapter in (None, "a", "b")]
            mixed = await run_all(engine, jobs)  # base rows and both adapters in one batch
    assert [tokens for tokens, _ in mixed] == [want[adapter][p] for adapter, p in jobs]


async def test_the_prefix_cache_keeps_an_adapters_kv_apart_from_the_bases(demo_cache_dir):
    want = expected(demo_cache_dir)
    long_prompt = 0
    cfg = adapters_cfg(demo_cache_dir, "cache.block_size=2")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            ((base, _),) = await run_all(engine, [(None, long_prompt)])
            ((adapted, cached),) = await run_all(engine, [("a", long_prompt)])
            ((again, cached_again),) = await run_all(engine, [("a", long_prompt)])
    assert base == want[None][long_prompt]
    assert (adapted, cached) == (want["a"][long_prompt], 0)  # the base's blocks are not the adapter's
    assert again == want["a"][long_prompt] and cached_again > 0  # its own blocks are


async def test_an_adapter_that_is_not_served_is_refused_at_admission(demo_cache_dir):
    params = SamplingParams(max_tokens=2, temperature=0.0, adapter="c")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(adapters_cfg(demo_cache_dir)) as engine:
            with pytest.raises(InvalidRequestError, match="adapter 'c' is not served"):
                await engine.submit(PROMPTS[0], params)
            ((tokens, _),) = await run_all(engine, [("a", 0)])  # the engine serves on
    assert len(tokens) == MAX_TOKENS
