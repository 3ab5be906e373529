"""Exact prompt token counts for ``count_tokens``: the template and tokenizer generation uses.

The count is what admission would count for the same turns (:func:`tokenize_prompt`, the
one function both call). A short prompt is counted on the event loop, as admission does; a
longer one in a thread, on a tokenizer copy of this counter's own (a tokenizer is not safe
to share between threads), one count at a time.
"""

from __future__ import annotations

from functools import partial

from ...actors.admission.chat_template import (
    ChatTemplateOptions,
    Tokenizer,
    as_prompt,
    prompt_chars,
    tokenize_prompt,
)
from ...messages import ChatMessage, ChatPrompt
from ..tokenizer_access import TokenizerAccess


class TokenCounter:
    def __init__(self, tokenizer: Tokenizer):
        self._access = TokenizerAccess(tokenizer)

    async def count(self, turns: ChatPrompt | tuple[ChatMessage, ...], *, prefill: bool = False) -> int:
        """The prompt's tokens; ``prefill``: its last (assistant) turn is left open to continue."""
        prompt = as_prompt(turns)
        options = ChatTemplateOptions(add_generation_prompt=not prefill, continue_final_message=prefill)
        tokenize = partial(_tokenize, prompt=prompt, options=options)
        return len(await self._access.run(tokenize, prompt_chars(prompt)))


def _tokenize(tokenizer: Tokenizer, *, prompt, options: ChatTemplateOptions) -> list[int]:
    return tokenize_prompt(tokenizer, prompt, options)
