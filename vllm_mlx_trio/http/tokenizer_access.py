"""The model's tokenizer for HTTP routes that tokenize outside admission (``count_tokens``,
``/tokenize``, ``/detokenize``, ``/v1/embeddings``).

Short work runs on the event loop, as admission's inline path does; longer work runs in a
thread, on a tokenizer copy of this object's own (a tokenizer is not safe to share between
threads), one call at a time (docs/architecture.md, "Who owns the tokenizer").
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import TypeVar

import trio

from ..actors.admission.actor import PREPROCESS_INLINE_CHARS
from ..actors.admission.chat_template import Tokenizer

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TokenizerAccess:
    """Runs ``fn(tokenizer)`` here or in a thread, by the characters it works through."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._thread_tokenizer: Tokenizer | None = None
        self._copied = False
        self._lock = trio.Lock()

    async def run(self, fn: Callable[[Tokenizer], T], chars: int) -> T:
        """``fn`` with a tokenizer: inline below ``PREPROCESS_INLINE_CHARS`` characters (or when
        the tokenizer cannot be copied), else in a thread on this object's copy."""
        if chars < PREPROCESS_INLINE_CHARS:
            return fn(self.tokenizer)
        async with self._lock:
            if not self._copied:
                self._thread_tokenizer = await trio.to_thread.run_sync(_copy_or_none, self.tokenizer)
                self._copied = True
            if self._thread_tokenizer is None:
                return fn(self.tokenizer)
            return await trio.to_thread.run_sync(fn, self._thread_tokenizer)


def _copy_or_none(tokenizer: Tokenizer) -> Tokenizer | None:
    try:
        return copy.deepcopy(tokenizer)
    except Exception as exc:  # boundary: a tokenizer class that cannot be copied
        logger.warning("tokenizer cannot be copied (%s); HTTP routes tokenize on the event loop", exc)
        return None
