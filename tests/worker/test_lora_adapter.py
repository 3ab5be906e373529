"""``[model] adapter_path``: a LoRA adapter in mlx-lm's format, applied at load; greedy output
equal to ``mlx_lm.load(path, adapter_path=...)``'s, alone and batched."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
import trio
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.demo.adapter import resolve_demo_adapter

pytestmark = pytest.mark.mlx

PROMPTS = ["Hello there, how are", "The sea was calm and"]
MAX_TOKENS = 16
TIMEOUT_S = 120


def mlx_lm_greedy(model, tokenizer, prompt: str) -> list[int]:
    steps = generate_step(mx.array(tokenizer.encode(prompt)), model, max_tokens=MAX_TOKENS, sampler=make_sampler(0.0))
    return [int(token) for token, _ in steps]


def cfg_for(demo_cache_dir: str, mode: str, adapter: str | None = "demo:tiny-lora"):
    overrides = ["model.path=demo:tiny", f"model.demo_cache_dir={demo_cache_dir}", f"engine.mode={mode}"]
    if adapter is not None:
        overrides.append(f"model.adapter_path={adapter}")
    return load_config(None, overrides=overrides, environ={})


async def engine_greedy(cfg) -> list[list[int]]:
    """Every prompt at once (one batch in batched mode), greedy, EOS ignored."""
    outputs: dict[int, list[int]] = {}
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)

    async def run(engine, i: int) -> None:
        with await engine.submit(PROMPTS[i], params) as stream:
            outputs[i] = [t async for delta in stream for t in delta.token_ids]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine, trio.open_nursery() as nursery:
            for i in range(len(PROMPTS)):
                nursery.start_soon(run, engine, i)
    return [outputs[i] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("mode", ["batched", "simple"])
async def test_greedy_output_equals_mlx_lm_loading_the_adapter(demo_cache_dir, mode):
    base = str(resolve_demo_model("demo:tiny", demo_cache_dir))
    adapter = str(resolve_demo_adapter("demo:tiny-lora", demo_cache_dir))
    adapted, tokenizer = mlx_lm.load(base, adapter_path=adapter)
    plain, _ = mlx_lm.load(base)
    want = [mlx_lm_greedy(adapted, tokenizer, p) for p in PROMPTS]
    assert want != [mlx_lm_greedy(plain, tokenizer, p) for p in PROMPTS]  # the adapter changes the model
    assert await engine_greedy(cfg_for(demo_cache_dir, mode)) == want
    # the adapter's folder works as a plain path too
    assert await engine_greedy(cfg_for(demo_cache_dir, mode, adapter)) == want


async def test_a_folder_without_an_adapter_fails_at_startup(demo_cache_dir, tmp_path):
    with pytest.raises(BaseExceptionGroup) as caught:
        await engine_greedy(cfg_for(demo_cache_dir, "batched", str(tmp_path)))
    refused = caught.value.subgroup(ModelLoadError)
    assert refused is not None
    while isinstance(refused, BaseExceptionGroup):
        refused = refused.exceptions[0]
    assert "no adapter_config.json" in str(refused)
