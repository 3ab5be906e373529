"""The admission step of structured output: compile a request's constraint for this model.

Called by ``actors/admission.py`` in a preprocessing thread (never on the event loop: the
first constrained request builds the llguidance tokenizer, ~1 s at a 151 k vocabulary).
"""

from __future__ import annotations

from typing import Any

import attrs

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
        tokenizer: Any,
        *,
        vocab_size: int,
        reasoning_markers: tuple[str, str] | None = None,
        cache_size: int = GRAMMAR_CACHE_SIZE,
    ):
        self._tokenizer = tokenizer
        self._markers = reasoning_markers
        eos = tuple(sorted(getattr(tokenizer, "eos_token_ids", None) or ()))
        self.compiler = ConstraintCompiler(
            lambda: llg_tokenizer_from(tokenizer, vocab_size=vocab_size, eos_token_ids=eos), cache_size=cache_size
        )

    def attach(self, params: SamplingParams, prompt_token_ids: list[int] | tuple[int, ...]) -> SamplingParams:
        """``params`` with its constraint compiled (unchanged when it has none)."""
        if params.constraint is None:
            return params
        compiled = self.compiler.compile(params.constraint, reasoning=self._reasoning(prompt_token_ids))
        return attrs.evolve(params, grammar=compiled)

    def _reasoning(self, prompt_token_ids: list[int] | tuple[int, ...]) -> ReasoningMarkers | None:
        if self._markers is None:
            return None
        start, end = self._markers
        tail = self._tokenizer.decode(list(prompt_token_ids[-PROMPT_TAIL_TOKENS:]))
        return ReasoningMarkers(start, end, starts_inside=tail.rfind(start) > tail.rfind(end))
