"""``vllm-mlx-trio bench prefix-cache``: a pass/fail table of the prefix cache's behaviour.

Short greedy requests on an in-process engine (``open_engine``), one at a time. Each
request's lookup kind (``HIT`` / ``PREFIX_HIT`` / ``MISS``) is read from the change of the
cache counters around it, and its ``cached_tokens`` from its usage; a row passes when the
kind is the expected one and ``cached_tokens`` agrees with it (0 for a miss, > 0 otherwise).

The cache is token-granular (a hit may end inside a block), so the "different prompt"
differs from prompt 1 from its first words on: a prompt that differed only in its tail would
legitimately be a hit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import attrs
import trio

from ...actors.prefix.cache_manager import CacheStatistics
from ...config import EngineConfig
from ...core.params import SamplingParams
from ...engine import Engine, open_engine

MAX_TOKENS = 8
_SYSTEM_BODY = (
    "Answer in plain words, keep every reply short and polite, never invent facts, say so when "
    "you do not know, prefer lists for steps, quote units with every number, and avoid jargon "
    "unless the user uses it first. "
)
#: The two system prompts differ from their first words on, so from the first block on.
_SYSTEM_A_START = "You are a careful assistant for a public library. "
_SYSTEM_B_START = "Tu es un assistant de voyage, bref et precis. "
_QUESTION_1 = "What is the capital of France?"
_QUESTION_2 = (
    "Name three rivers of Europe, say which countries each one flows through, how long each "
    "one is in kilometres, and which of them is the longest; then suggest one city on each "
    "river that a visitor should see first, with one sentence on why. "
)
#: Tokens of the shared system prompt, in blocks.
SYSTEM_BLOCKS = 4
#: The smallest block_size for which the short prompt is certainly shorter than a block.
MIN_SHORT_BLOCK = 4
#: The short exact repeat of the issue's figure: a 48-token prompt, 5 requests at once.
SHORT_REPEAT_TOKENS = 48
SHORT_REPEAT_CONCURRENCY = 5
#: The target: a repeat's median TTFT at most this share of a cold run's.
SHORT_REPEAT_TARGET = 0.5
_SHORT_REPEAT_TEXT = (
    "Please summarise the following note in one line: the meeting moved to Thursday at ten, "
    "bring the budget figures and the draft of the spring report. "
)


@attrs.frozen(kw_only=True)
class Prompts:
    """The chat prompts of the table, sized in tokens for the model's tokenizer."""

    one: tuple[dict, ...]
    other: tuple[dict, ...]
    shared: tuple[dict, ...]
    #: A raw completion prompt (no chat template) of a couple of tokens: never a full block.
    short: str = "Hi"


def build_prompts(tokenizer, block_size: int) -> Prompts:
    """Prompt 1; one differing in its first block; one sharing prompt 1's system prompt.

    The system prompts span ``SYSTEM_BLOCKS`` blocks; the shared prompt's question is longer
    than a block, so its prompt has a full block past what it shares with prompt 1.
    """

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    body = _repeated(_SYSTEM_BODY, SYSTEM_BLOCKS * block_size, count)
    question_2 = _repeated(_QUESTION_2, block_size + 1, count)
    system_a = {"role": "system", "content": _SYSTEM_A_START + body}
    system_b = {"role": "system", "content": _SYSTEM_B_START + body}
    return Prompts(
        one=(system_a, {"role": "user", "content": _QUESTION_1}),
        other=(system_b, {"role": "user", "content": _QUESTION_1}),
        shared=(system_a, {"role": "user", "content": question_2.strip()}),
    )


def _repeated(text: str, min_tokens: int, count) -> str:
    """``text`` repeated until it is at least ``min_tokens`` tokens long."""
    times = 1
    while count(text * times) < min_tokens:
        times += 1
    return text * times


HIT, PREFIX_HIT, MISS, NONE = "HIT", "PREFIX_HIT", "MISS", "NONE"
_KIND_COUNTERS = {HIT: "num_hits", PREFIX_HIT: "num_prefix_hits", MISS: "num_misses"}
HEADERS = ("Step", "Description", "Expected", "Actual", "Cached", "TTFT ms", "Status")


@attrs.frozen(kw_only=True)
class Row:
    """One line of the table; ``cached_tokens`` is None for rows that are not a request."""

    step: str
    description: str
    expected: str
    actual: str
    passed: bool
    cached_tokens: int | None = None
    ttft_ms: float | None = None
    #: A measurement to read (a timing), not a verdict: its status is "INFO".
    info: bool = False

    def cells(self) -> tuple[str, ...]:
        cached = "-" if self.cached_tokens is None else str(self.cached_tokens)
        ttft = "-" if self.ttft_ms is None else f"{self.ttft_ms:.1f}"
        status = "INFO" if self.info else "PASS" if self.passed else "FAIL"
        return (self.step, self.description, self.expected, self.actual, cached, ttft, status)


@attrs.frozen(kw_only=True)
class Outcome:
    """What one request did: its lookup kind, ``cached_tokens`` and greedy tokens."""

    kind: str
    cached_tokens: int
    token_ids: tuple[int, ...]
    #: Seconds from submit to the first token (the prefill a hit shortens).
    ttft_s: float = 0.0
    #: The sampled tokens' logprobs, when asked for.
    logprobs: tuple[float, ...] = ()


def lookup_kind(before: CacheStatistics, after: CacheStatistics) -> str:
    """The one lookup counted between two snapshots; NONE if none, '?' if several."""
    moved = [
        kind
        for kind, counter in _KIND_COUNTERS.items()
        for _ in range(getattr(after, counter) - getattr(before, counter))
    ]
    if not moved:
        # A disabled cache counts no lookups: every prompt is computed, a miss by construction.
        return NONE if after.enabled else MISS
    return moved[0] if len(moved) == 1 else "?"


async def run_request(
    engine: Engine, prompt: str | Sequence[dict], *, cache_salt: str | None = None, logprobs: bool = False
) -> Outcome:
    """One greedy request of ``MAX_TOKENS`` tokens, read to its end."""
    params = SamplingParams(
        temperature=0.0, max_tokens=MAX_TOKENS, cache_salt=cache_salt, logprobs=1 if logprobs else None
    )
    before = engine.statistics().cache
    token_ids: list[int] = []
    token_logprobs: list[float] = []
    start, ttft_s = time.perf_counter(), 0.0
    with await engine.submit(prompt if isinstance(prompt, str) else list(prompt), params) as stream:
        async for delta in stream:
            if not token_ids and delta.token_ids:
                ttft_s = time.perf_counter() - start
            token_ids.extend(delta.token_ids)
            token_logprobs.extend(lp.logprob for lp in delta.logprobs)
    kind = lookup_kind(before, engine.statistics().cache)
    return Outcome(
        kind=kind,
        cached_tokens=stream.usage.cached_tokens,
        token_ids=tuple(token_ids),
        ttft_s=ttft_s,
        logprobs=tuple(token_logprobs),
    )


def request_row(step: str, description: str, expected: tuple[str, ...], outcome: Outcome) -> Row:
    """A request's row: the kind is expected and ``cached_tokens`` agrees with it."""
    consistent = (outcome.cached_tokens == 0) == (outcome.kind == MISS)
    return Row(
        step=step,
        description=description,
        expected=" or ".join(expected),
        actual=outcome.kind,
        passed=outcome.kind in expected and consistent,
        cached_tokens=outcome.cached_tokens,
        ttft_ms=outcome.ttft_s * 1000,
    )


def same_tokens_row(step: str, description: str, outcomes: Sequence[Outcome]) -> Row:
    """Whether greedy requests of one prompt produced the same tokens."""
    same = len({o.token_ids for o in outcomes}) == 1 and bool(outcomes[0].token_ids)
    return Row(
        step=step,
        description=description,
        expected="same tokens",
        actual="same tokens" if same else "differ",
        passed=same,
    )


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


def short_repeat_prompt(tokenizer, salt: str) -> str:
    """A raw prompt of exactly ``SHORT_REPEAT_TOKENS`` tokens, its start set apart by ``salt``."""
    ids = tokenizer.encode(_repeated(f"{salt} {_SHORT_REPEAT_TEXT}", SHORT_REPEAT_TOKENS + 8, _count(tokenizer)))
    for cut in range(SHORT_REPEAT_TOKENS, SHORT_REPEAT_TOKENS + 8):  # a cut that re-encodes the same
        text = tokenizer.decode(ids[:cut])
        if len(tokenizer.encode(text)) == SHORT_REPEAT_TOKENS:
            return text
    raise ValueError(f"no {SHORT_REPEAT_TOKENS}-token prompt for this tokenizer")


def _count(tokenizer):
    return lambda text: len(tokenizer.encode(text))


async def run_concurrently(engine: Engine, prompt: str, n: int) -> list[Outcome]:
    """``n`` greedy requests of one prompt at once; their outcomes (kinds not told apart)."""
    outcomes: list[Outcome] = []

    async def one() -> None:
        outcomes.append(await run_request(engine, prompt))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return outcomes


def median_ttft_ms(outcomes: Sequence[Outcome]) -> float:
    return statistics.median(o.ttft_s for o in outcomes) * 1000


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
    from .tier_rows import disk_tier_rows, quantized_rows  # noqa: PLC0415 (they import this module)

    if quantized:
        rows += await quantized_rows(cfg, prompts)
    if disk:
        rows += await disk_tier_rows(cfg, prompts)
    return rows


def all_passed(rows: Sequence[Row]) -> bool:
    return all(row.passed for row in rows)


def format_rows(rows: Sequence[Row]) -> str:
    """The table: ``  Step   | Description | ... | Status``, columns padded to fit."""
    lines = [HEADERS, *(row.cells() for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADERS))]
    widths[0] = max(widths[0], 6)
    return "\n".join(
        "  " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


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
        from .vs_mlx_lm import compare_with_mlx_lm  # noqa: PLC0415 (it imports this module)

        model_dir = resolve_model_path(cfg.model)
        rows += compare_with_mlx_lm(model_dir, _tokenizer(model_dir), runs=runs, variants=variants, port=port)
    print(f"model {cfg.model.path}, block_size {cfg.cache.block_size}, greedy, max_tokens {MAX_TOKENS}")
    print(format_rows(rows))
    verdicts = [row for row in rows if not row.info]
    print(f"{sum(row.passed for row in verdicts)}/{len(verdicts)} passed")
    return 0 if all_passed(rows) else 1


def _tokenizer(model_dir: str):
    from transformers import AutoTokenizer  # noqa: PLC0415 (only the HTTP comparison needs it)

    return AutoTokenizer.from_pretrained(model_dir)
