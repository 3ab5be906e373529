"""The pieces of ``bench prefix-cache``'s table: its prompts, one request and its outcome, a row.

Short greedy requests on an in-process engine, one at a time. Each request's lookup kind
(``HIT`` / ``PREFIX_HIT`` / ``MISS``) is read from the change of the cache counters around it,
and its ``cached_tokens`` from its usage; a row passes when the kind is the expected one and
``cached_tokens`` agrees with it (0 for a miss, > 0 otherwise). ``run.py`` puts the rows
together; ``tier_rows.py`` and ``vs_mlx_lm.py`` add rows of their own from these pieces.

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
from ...core.params import SamplingParams
from ...engine import Engine

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
#: The short exact repeat (rows 2d-2g, 7a-7c): a 48-token prompt, 5 requests at once.
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
