"""The prompts the benchmarks send, and the shape of a run (concurrency levels, tokens).

Benchmark prompts are runs of words from the bundled corpus (``data/corpus.txt``), each from
a different place so no two share a prefix (our prefix cache cannot help one with another).
:data:`PROMPT_WORDS` words make about 50 tokens once chat-templated with ``demo:small``'s
tokenizer (about 90 with ``demo:tiny``'s smaller vocabulary); the tables report the counted
prompt tokens.
"""

from __future__ import annotations

import functools
import importlib.resources

import attrs

#: The prompts of vllm-mlx's published continuous-batching table (the "seeds" workload).
SEED_PROMPTS = ("What is 2+2?", "Name 3 colors.", "What is Python?", "Capital of Japan?", "Who wrote Hamlet?")
SEED_MAX_TOKENS = 50
PROMPT_WORDS = 32
#: Words between the starts of consecutive prompts.
PROMPT_STRIDE = 53
WARMUP_TOKENS = 4


@attrs.frozen(kw_only=True)
class Workload:
    """What every measured level runs: ``max(concurrency, min_requests)`` requests."""

    max_tokens: int = 128
    concurrency: tuple[int, ...] = (1, 5, 16)
    min_requests: int = 3

    def num_requests(self, concurrency: int) -> int:
        return max(concurrency, self.min_requests)


def chat(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


@functools.cache
def _corpus_words() -> tuple[str, ...]:
    text = importlib.resources.files("vllm_mlx_trio").joinpath("data/corpus.txt").read_text("utf-8")
    return tuple(text.split())


def corpus_text(words: int) -> str:
    """The corpus's first ``words`` words, as one text (a long system prompt)."""
    return " ".join(_corpus_words()[:words])


def bench_prompt(index: int) -> str:
    """The ``index``-th benchmark prompt (wraps around the corpus)."""
    words = _corpus_words()
    start = (index * PROMPT_STRIDE) % (len(words) - PROMPT_WORDS)
    return " ".join(words[start : start + PROMPT_WORDS])


def bench_prompts(count: int, first: int = 0) -> list[str]:
    """``count`` consecutive benchmark prompts starting at prompt ``first``."""
    return [bench_prompt(first + i) for i in range(count)]


class PromptBlocks:
    """Hands out disjoint blocks of prompts, so each measured level gets fresh ones.

    Two paths that call it in the same order (the ceiling and the engine) get the same
    prompts for the same level.
    """

    def __init__(self, first: int = 0):
        self._next = first

    def take(self, count: int) -> list[str]:
        prompts = bench_prompts(count, self._next)
        self._next += count
        return prompts


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1,5,16"`` -> ``(1, 5, 16)``; every level must be >= 1."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ValueError(f"concurrency levels must be >= 1, got {text!r}")
    return levels
