"""``vllm-mlx-trio bench prefix-cache``: a pass/fail table of the prefix cache's behaviour.

The rows, on in-process engines (``open_engine``): 1a-1e repeats of one prompt and another,
2a-2g a shared system prompt, another ``cache_salt``, short prompts and a 48-token repeat at
once, 3a-3b clearing, 4a-4b the cache off, 5a-6c its tiers (``tier_rows.py``); with
``--mlx-lm``, 7a-7c over HTTP against mlx_lm.server (``vs_mlx_lm.py``). How a request becomes
a row: ``table.py``.
"""

from __future__ import annotations

import time

import attrs
import trio

from ...config import EngineConfig
from ...engine import Engine, open_engine
from .table import (
    HIT,
    MAX_TOKENS,
    MIN_SHORT_BLOCK,
    MISS,
    PREFIX_HIT,
    SHORT_REPEAT_CONCURRENCY,
    SHORT_REPEAT_TARGET,
    SHORT_REPEAT_TOKENS,
    Outcome,
    Prompts,
    Row,
    all_passed,
    build_prompts,
    format_rows,
    median_ttft_ms,
    request_row,
    run_concurrently,
    run_request,
    same_tokens_row,
    short_repeat_prompt,
)
from .tier_rows import disk_tier_rows, quantized_rows
from .vs_mlx_lm import compare_with_mlx_lm


async def _repeat_rows(engine: Engine, prompts: Prompts) -> tuple[list[Row], Outcome]:
    """1a-1e: a miss, the same prompt, a different one, prompt 1 again, and their outputs."""
    first = await run_request(engine, prompts.one)
    again = await run_request(engine, prompts.one)
    other = await run_request(engine, prompts.other)
    back = await run_request(engine, prompts.one)
    rows = [
        request_row("1a", "First request", (MISS,), first),
        request_row("1b", "Same prompt", (HIT,), again),
        request_row("1c", "Different prompt", (MISS, PREFIX_HIT), other),
        request_row("1d", "Return to prompt 1", (HIT,), back),
        same_tokens_row("1e", "Outputs identical", (first, again, back)),
    ]
    return rows, again


async def _sharing_rows(engine: Engine, prompts: Prompts) -> list[Row]:
    """2a-2c: a shared system prompt, another cache_salt, a prompt shorter than a block (a hit:
    reuse is token-granular, all but the last token of an exact repeat).

    The short prompt's row is left out for blocks under ``MIN_SHORT_BLOCK`` tokens, which
    even "Hi" can fill.
    """
    shared = await run_request(engine, prompts.shared)
    salted = await run_request(engine, prompts.one, cache_salt="another-tenant")
    rows = [
        request_row("2a", "Shared system prompt", (PREFIX_HIT,), shared),
        request_row("2b", "Other cache_salt", (MISS,), salted),
    ]
    if engine.cfg.cache.block_size >= MIN_SHORT_BLOCK:
        await run_request(engine, prompts.short)
        short = await run_request(engine, prompts.short)
        # token-granular: a hit unless the prompt is a single token (its last is recomputed)
        single = len(engine.model_info.tokenizer.encode(prompts.short)) < 2
        rows.append(request_row("2c", "Short prompt, again", (MISS,) if single else (HIT,), short))
    return rows


async def _short_repeat_rows(engine: Engine) -> list[Row]:
    """2d-2g: a 48-token prompt sent 5 times at once, cold, then again: the repeat reuses all
    but its last token (no whole block fits in it at the default block size)."""
    prompt = short_repeat_prompt(engine.model_info.tokenizer, f"Note {time.monotonic_ns() % 997}:")
    n = SHORT_REPEAT_CONCURRENCY
    cold = await run_concurrently(engine, prompt, n)
    before = engine.statistics().cache
    warm = await run_concurrently(engine, prompt, n)
    after = engine.statistics().cache
    hits = after.num_hits - before.num_hits
    cached = {o.cached_tokens for o in warm}
    cold_ms, warm_ms = median_ttft_ms(cold), median_ttft_ms(warm)
    ratio = warm_ms / cold_ms if cold_ms else float("inf")
    return [
        Row(
            step="2d",
            description=f"{SHORT_REPEAT_TOKENS}-token prompt x{n}, cold",
            expected="computed",
            actual="computed",
            passed=True,
            cached_tokens=min(o.cached_tokens for o in cold),
            ttft_ms=cold_ms,
        ),
        Row(
            step="2e",
            description=f"Same x{n}, again",
            expected=f"{n} HIT, {SHORT_REPEAT_TOKENS - 1} cached",
            actual=f"{hits} HIT, {'/'.join(map(str, sorted(cached)))} cached",
            passed=hits == n and cached == {SHORT_REPEAT_TOKENS - 1},
            cached_tokens=max(cached),
            ttft_ms=warm_ms,
        ),
        Row(
            step="2f",
            description="Repeat TTFT / cold TTFT",
            expected=f"<= {SHORT_REPEAT_TARGET}",
            actual=f"{ratio:.2f}",
            passed=True,
            info=True,
        ),
        same_tokens_row("2g", "Outputs identical", (*cold, *warm)),
    ]


async def _clear_rows(engine: Engine, prompts: Prompts) -> list[Row]:
    """3a-3b: clearing drops the cached blocks, and prompt 1 is a miss again."""
    dropped = await engine.clear_prefix_cache()
    after = await run_request(engine, prompts.one)
    return [
        Row(
            step="3a",
            description="Clear the cache",
            expected="> 0 blocks dropped",
            actual=f"{dropped} blocks dropped",
            passed=dropped > 0,
        ),
        request_row("3b", "Prompt 1 after clear", (MISS,), after),
    ]


async def _disabled_rows(cfg: EngineConfig, prompts: Prompts, cached: Outcome) -> list[Row]:
    """4a-4b: with the cache off, prompt 1 twice is computed twice, to the same tokens."""
    off = attrs.evolve(cfg, cache=attrs.evolve(cfg.cache, enabled=False))
    async with open_engine(off) as engine:
        await run_request(engine, prompts.one)
        uncached = await run_request(engine, prompts.one)
    return [
        request_row("4a", "Cache disabled, again", (MISS,), uncached),
        same_tokens_row("4b", "Uncached = cached output", (cached, uncached)),
    ]


async def check_prefix_cache(
    cfg: EngineConfig,
    *,
    disabled_run: bool = True,
    short_repeat: bool = True,
    quantized: bool = True,
    disk: bool = True,
) -> list[Row]:
    """Every row of the table, on ``cfg``'s model (the demo model unless told otherwise)."""
    async with open_engine(cfg) as engine:
        prompts = build_prompts(engine.model_info.tokenizer, cfg.cache.block_size)
        rows, cached = await _repeat_rows(engine, prompts)
        rows += await _sharing_rows(engine, prompts)
        if short_repeat:
            rows += await _short_repeat_rows(engine)
        rows += await _clear_rows(engine, prompts)
    if disabled_run:
        rows += await _disabled_rows(cfg, prompts, cached)
    if quantized:
        rows += await quantized_rows(cfg, prompts)
    if disk:
        rows += await disk_tier_rows(cfg, prompts)
    return rows


def run_prefix_cache_bench(
    cfg: EngineConfig,
    *,
    disabled_run: bool = True,
    mlx_lm: bool = False,
    only_mlx_lm: bool = False,
    runs: int = 3,
    variants: dict[str, str] | None = None,
    port: int = 8711,
) -> int:
    """Print the table; 0 when every row passes, 1 otherwise. ``mlx_lm``: add rows 7a-7c, the
    48-token repeat over HTTP against mlx_lm.server (``bench/prefix_cache/vs_mlx_lm.py``) in ``runs``
    rounds (servers on ports from ``port``), with our server from the ``variants`` checkouts
    too; ``only_mlx_lm``: only those."""
    rows = [] if only_mlx_lm else trio.run(lambda: check_prefix_cache(cfg, disabled_run=disabled_run))
    if mlx_lm or only_mlx_lm:
        from ...worker.loading import resolve_model_path  # noqa: PLC0415 (builds a demo model: mlx)

        model_dir = resolve_model_path(cfg.model)
        rows += compare_with_mlx_lm(model_dir, _tokenizer(model_dir), runs=runs, variants=variants, port=port)
    print(f"model {cfg.model.path}, block_size {cfg.cache.block_size}, greedy, max_tokens {MAX_TOKENS}")
    print(format_rows(rows))
    verdicts = [row for row in rows if not row.info]
    print(f"{sum(row.passed for row in verdicts)}/{len(verdicts)} passed")
    return 0 if all_passed(rows) else 1


def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer  # noqa: PLC0415 (only the HTTP comparison needs it)

    from ...worker.gguf import tokenizer_dir

    return AutoTokenizer.from_pretrained(tokenizer_dir(model_dir))
