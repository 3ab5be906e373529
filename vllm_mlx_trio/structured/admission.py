"""The admission step of structured output: compile a request's constraint for this model.

Called by ``actors/admission/actor.py`` in a preprocessing thread, with that thread's tokenizer
copy (never the event loop's tokenizer, never on the event loop: the first constrained
request builds the llguidance tokenizer, ~1 s at a 151 k vocabulary).
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
from llguidance import LLTokenizer

from ..core.constraint import ReasoningMarkers
from ..core.params import SamplingParams
from .compiler import GRAMMAR_CACHE_SIZE, ConstraintCompiler, llg_tokenizer_from

#: Prompt tokens decoded to see whether the template left the prompt inside a thinking block.
PROMPT_TAIL_TOKENS = 16


class ConstraintStep:
    """Compiles constraints for one model; ``reasoning_markers`` (start, end) of the model's
    thinking block, when it has one, let the grammar allow that block first."""

    def __init__(
        self,
        *,
        vocab_size: int,
        eos_token_ids: tuple[int, ...] = (),
        reasoning_markers: tuple[str, str] | None = None,
        cache_size: int = GRAMMAR_CACHE_SIZE,
    ):
        self._vocab_size = vocab_size
        self._eos = eos_token_ids
        self._markers = reasoning_markers
        self._llg: LLTokenizer | None = None
        self._lock = threading.Lock()
        self.compiler = ConstraintCompiler(self._built_llg_tokenizer, cache_size=cache_size)

    def attach(
        self, params: SamplingParams, prompt_token_ids: list[int] | tuple[int, ...], tokenizer: Any
    ) -> SamplingParams:
        """``params`` with its constraint compiled (unchanged when it has none). ``tokenizer``
        is the calling thread's own (mlx-lm's wrapper): the llguidance tokenizer is built from
        it once, and it reads the prompt's tail for the reasoning markers."""
        if params.constraint is None:
            return params
        with self._lock:
            if self._llg is None:
                self._llg = llg_tokenizer_from(tokenizer, vocab_size=self._vocab_size, eos_token_ids=self._eos)
        reasoning = self._reasoning(prompt_token_ids, tokenizer)
        return attrs.evolve(params, grammar=self.compiler.compile(params.constraint, reasoning=reasoning))

    def _built_llg_tokenizer(self) -> LLTokenizer:
        assert self._llg is not None, "attach builds it first"
        return self._llg

    def _reasoning(self, prompt_token_ids: list[int] | tuple[int, ...], tokenizer: Any) -> ReasoningMarkers | None:
        if self._markers is None:
            return None
        start, end = self._markers
        tail = tokenizer.decode(list(prompt_token_ids[-PROMPT_TAIL_TOKENS:]))
        return ReasoningMarkers(start, end, starts_inside=tail.rfind(start) > tail.rfind(end))
