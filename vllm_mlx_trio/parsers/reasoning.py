"""Reasoning parsers: split the thinking block (``<think>...</think>``) from the answer as it streams.

``qwen3`` and ``deepseek_r1`` (vLLM's names) read the same markup: an optional ``<think>`` at the
very start of the output (or in the prompt: ``starts_in_reasoning``), reasoning up to ``</think>``,
then the answer. The gpt-oss harmony format (``openai_gptoss``) is parsed by :mod:`.harmony`.
"""

from __future__ import annotations

import logging
from typing import ClassVar, Literal

from .text import MarkupTrimmer, find_first, partial_marker_len

logger = logging.getLogger(__name__)

Kind = Literal["reasoning", "content"]


class ThinkTagReasoning:
    """``<think>reasoning</think>answer``; the opener may be in the prompt instead of the output."""

    name: ClassVar[str] = "qwen3"
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"

    def __init__(self, *, starts_in_reasoning: bool = False, answer_starts: tuple[str, ...] = ()) -> None:
        """``answer_starts``: markup that ends the reasoning without its closer and starts the answer
        (Kimi-K2-Thinking writes its tool calls inside the thinking block)."""
        self._answer_starts = answer_starts
        self._ends = (self.end, *answer_starts)
        self._first_chars = frozenset(marker[0] for marker in self._ends)
        self._state: Literal["opening", "reasoning", "content"] = "opening"
        self._inside = starts_in_reasoning
        self._pending = ""
        self._reasoning = MarkupTrimmer(after_markup=True)
        self._warned_stray_end = False
        self._strip_content_start = False

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        """Pieces of ``text`` as (kind, text), in order; partial markers are held back."""
        if not self._pending and not any(ch in text for ch in self._first_chars):  # fast path: no marker in it
            if self._state == "content" and not self._strip_content_start:
                return [("content", text)] if text else []
            if self._state == "reasoning":
                piece = self._reasoning.push(text)
                return [("reasoning", piece)] if piece else []
        self._pending += text
        out: list[tuple[Kind, str]] = []
        while self._pending:
            before = (self._state, len(self._pending))
            getattr(self, f"_step_{self._state}")(out)
            if (self._state, len(self._pending)) == before:
                break
        return [(kind, piece) for kind, piece in out if piece]

    def finish(self) -> list[tuple[Kind, str]]:
        out: list[tuple[Kind, str]] = []
        rest, self._pending = self._pending, ""
        if self._state == "opening":
            self._state = "reasoning" if self._inside else "content"
        if self._state == "reasoning":
            out.append(("reasoning", self._reasoning.push(rest) + self._reasoning.flush()))
        else:
            out.append(("content", rest))
        return [(kind, piece) for kind, piece in out if piece]

    def _step_opening(self, out: list[tuple[Kind, str]]) -> None:
        """At the start: wait until the output shows whether it opens with the start marker."""
        stripped = self._pending.lstrip()
        if not stripped or (self.start.startswith(stripped) and stripped != self.start):
            return
        if stripped.startswith(self.start):
            self._pending = stripped[len(self.start) :]
            self._state = "reasoning"
        else:
            self._state = "reasoning" if self._inside else "content"

    def _step_reasoning(self, out: list[tuple[Kind, str]]) -> None:
        found = find_first(self._pending, self._ends)
        if found is None:
            keep = partial_marker_len(self._pending, self._ends)
            out.append(("reasoning", self._reasoning.push(self._pending[: len(self._pending) - keep])))
            self._pending = self._pending[len(self._pending) - keep :]
            return
        at, marker = found
        out.append(("reasoning", self._reasoning.push(self._pending[:at])))
        self._reasoning.markup()
        # the closer is dropped; markup that starts the answer stays for the tool parser
        self._pending = self._pending[at + len(self.end) :] if marker == self.end else self._pending[at:]
        self._state = "content"
        self._strip_content_start = True

    def _step_content(self, out: list[tuple[Kind, str]]) -> None:
        if self._strip_content_start:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return
            self._strip_content_start = False
        at = self._pending.find(self.end)
        if at < 0:
            keep = partial_marker_len(self._pending, (self.end,))
            out.append(("content", self._pending[: len(self._pending) - keep]))
            self._pending = self._pending[len(self._pending) - keep :]
            return
        # A closer with no opener: the prompt ended inside the thinking block but the caller
        # did not say so. The marker is dropped (markup never reaches the content).
        if not self._warned_stray_end:
            logger.warning("%s: %r without %r; was the prompt's opener missed?", self.name, self.end, self.start)
            self._warned_stray_end = True
        out.append(("content", self._pending[:at]))
        self._pending = self._pending[at + len(self.end) :]


class Qwen3Reasoning(ThinkTagReasoning):
    name = "qwen3"


class DeepSeekR1Reasoning(ThinkTagReasoning):
    """DeepSeek-R1: its template puts ``<think>\\n`` into the prompt (``starts_in_reasoning``)."""

    name = "deepseek_r1"


class HarmonyReasoning:
    """gpt-oss: the harmony ``analysis`` channel is the reasoning (parsed by :mod:`.harmony`)."""

    name: ClassVar[str] = "openai_gptoss"
    start: ClassVar[str] = "<|channel|>analysis<|message|>"
    end: ClassVar[str] = "<|end|>"


REASONING_PARSERS = {cls.name: cls for cls in (Qwen3Reasoning, DeepSeekR1Reasoning, HarmonyReasoning)}


def reasoning_markers(name: str) -> tuple[str, str]:
    """(start, end) markers of the reasoning parser ``name``, e.g. ("<think>", "</think>")."""
    cls = REASONING_PARSERS.get(name)
    if cls is None:
        raise KeyError(f"unknown reasoning parser {name!r}; known: {', '.join(sorted(REASONING_PARSERS))}")
    return cls.start, cls.end


def prompt_ends_in_reasoning(name: str, prompt_text: str) -> bool:
    """The chat template put the reasoning opener at the end of the prompt (the model starts inside)."""
    start, _ = reasoning_markers(name)
    return prompt_text.rstrip().endswith(start)
