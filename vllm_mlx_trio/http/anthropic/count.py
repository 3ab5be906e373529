"""Exact prompt token counts for ``count_tokens``: the template and tokenizer generation uses.

The count is what admission would count for the same turns (:func:`tokenize_prompt`, the
one function both call). A short prompt is counted on the event loop, as admission does; a
longer one in a thread, on a tokenizer copy of this counter's own (a tokenizer is not safe
to share between threads), one count at a time.
"""

from __future__ import annotations

import copy
import logging

import trio

from ...actors.admission.actor import PREPROCESS_INLINE_CHARS
from ...actors.admission.chat_template import (
    ChatTemplateOptions,
    Tokenizer,
    as_prompt,
    prompt_chars,
    tokenize_prompt,
)
from ...messages import ChatMessage, ChatPrompt

logger = logging.getLogger(__name__)


class TokenCounter:
    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._thread_tokenizer: Tokenizer | None = None
        self._lock = trio.Lock()

    async def count(self, turns: ChatPrompt | tuple[ChatMessage, ...], *, prefill: bool = False) -> int:
        """The prompt's tokens; ``prefill``: its last (assistant) turn is left open to continue."""
        prompt = as_prompt(turns)
        options = ChatTemplateOptions(add_generation_prompt=not prefill, continue_final_message=prefill)
        if prompt_chars(prompt) < PREPROCESS_INLINE_CHARS:
            return len(tokenize_prompt(self._tokenizer, prompt, options))
        async with self._lock:
            if self._thread_tokenizer is None:
                self._thread_tokenizer = await trio.to_thread.run_sync(_copy_or_none, self._tokenizer)
            if self._thread_tokenizer is None:
                return len(tokenize_prompt(self._tokenizer, prompt, options))
            return len(await trio.to_thread.run_sync(tokenize_prompt, self._thread_tokenizer, prompt, options))


def _copy_or_none(tokenizer: Tokenizer) -> Tokenizer | None:
    try:
        return copy.deepcopy(tokenizer)
    except Exception as exc:  # boundary: a tokenizer class that cannot be copied
        logger.warning("tokenizer cannot be copied (%s); count_tokens counts on the event loop", exc)
        return None
