"""Fresh prompts of given token lengths for ``bench latency``.

Every prompt starts with a tag unique to its (repetition, level, index), inside the first
prefix-cache block, so no server can reuse one prompt's KV for another; its body is corpus
text from a different place for each prompt. Lengths are counted with the model's own
tokenizer and chat template (words are scaled to the tokens wanted, then checked).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from ..workload import _corpus_words, chat

#: Words between the starts of consecutive prompts' bodies (prime: bodies rarely coincide).
BODY_STRIDE = 211
#: A prompt at most this share under its target length (never over: the model's context is
#: the limit of the longest) is accepted as it is.
LENGTH_TOLERANCE = 0.05
#: Tries to bring a prompt within the tolerance by rescaling its word count.
FIT_TRIES = 8

Counter = Callable[[str], int]


def chat_token_counter(model_dir: str) -> Counter:
    """Tokens of a one-message chat, templated as the servers do it (the model's tokenizer)."""
    from transformers import AutoTokenizer

    from ...worker.gguf import tokenizer_dir

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir(model_dir))

    def count(text: str) -> int:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(chat(text), add_generation_prompt=True, tokenize=False)
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count


def _body(start: int, num_words: int) -> str:
    words = _corpus_words()
    return " ".join(words[(start + i) % len(words)] for i in range(num_words))


class PromptMaker:
    """Prompts of about ``tokens`` tokens each, never two alike."""

    def __init__(self, count_tokens: Counter):
        self._count = count_tokens
        self._next = 0

    @functools.cached_property
    def _tokens_per_word(self) -> float:
        sample = _body(0, 400)
        return max((self._count(sample) - self._count("")) / 400, 0.1)

    def make(self, tag: str, tokens: int) -> str:
        start = self._next * BODY_STRIDE
        self._next += 1
        overhead = self._count(f"[{tag}]")
        words = max(1, round((tokens - overhead) / self._tokens_per_word))
        text = f"[{tag}] {_body(start, words)}"
        for _ in range(FIT_TRIES):
            got = self._count(text)
            if (1 - LENGTH_TOLERANCE) * tokens <= got <= tokens:
                break
            scaled = words * (tokens - overhead) / max(got - overhead, 1)
            words = max(1, int(scaled) - (1 if got > tokens else 0))
            text = f"[{tag}] {_body(start, words)}"
        return text

    def batch(self, tag: str, lengths: Sequence[int], count: int) -> list[str]:
        """``count`` prompts cycling through ``lengths`` (request i has lengths[i % len])."""
        return [self.make(f"{tag}.{i}", lengths[i % len(lengths)]) for i in range(count)]
