"""Thinking requests and speculation: ``[speculative] thinking_retirement_resume``.

A request whose reply has a thinking block (the template opened it at the end of the prompt, or the output opens
it) stays off the speculative path from the moment the block is seen: thinking-time processing stays active for the
whole request, outside the envelope, which is the default. With the opt-in (``thinking_retirement_resume = true``,
or ``VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME=1`` as in the seeds) the request comes back to speculation once its
reasoning block has ended (the closing marker is in its output), if the rest of the envelope holds; it leaves again
should the output open another block. Requests of models without a reasoning parser are unaffected.

The markers are the reasoning parser's (``[model] reasoning_parser``, "auto" detected from the chat template), as
token ids. Pure logic on token ids (no MLX); the speculative runner asks :meth:`ThinkingGate.allows` each step.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .... import parsers
from ....output_format import _resolve, chat_template_text

#: The seeds' switch for the opt-in, beside the config key.
RESUME_ENV = "VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME"
#: Prompt tokens decoded to tell whether the template opened the thinking block (as admission does).
PROMPT_TAIL_TOKENS = 16


def resume_enabled(cfg: Any, environ: Mapping[str, str] = os.environ) -> bool:
    """The opt-in: the config key, or the seeds' environment variable set to 1."""
    return bool(cfg.speculative.thinking_retirement_resume) or environ.get(RESUME_ENV, "").strip() == "1"


class Phase(enum.Enum):
    NONE = "none"  # no thinking block seen in the reply
    THINKING = "thinking"  # inside the block
    ENDED = "ended"  # the block was closed


@attrs.frozen
class ThinkingMarkers:
    """The thinking block's opening and closing markers as token ids, and their text."""

    start: tuple[int, ...]
    end: tuple[int, ...]
    start_text: str

    @classmethod
    def for_model(cls, model_cfg: Any, tokenizer: Any) -> ThinkingMarkers | None:
        """The markers of the model's reasoning parser; None when it has none."""
        name = _resolve(model_cfg.reasoning_parser, parsers.detect_reasoning_parser, chat_template_text(tokenizer))
        if name is None:
            return None
        start, end = parsers.reasoning_markers(name)
        start_ids = tuple(tokenizer.encode(start, add_special_tokens=False))
        end_ids = tuple(tokenizer.encode(end, add_special_tokens=False))
        return cls(start_ids, end_ids, start) if start_ids and end_ids else None


@attrs.define
class _Track:
    sequence: Any  # the sequence (object) this track follows: a request that comes back anew starts afresh
    phase: Phase
    scanned: int = 0  # output tokens already looked at
    after_marker: int = 0  # the index just after the last marker found (none is searched before it)


def _find(tokens: Sequence[int], marker: tuple[int, ...], first: int) -> int:
    """The index just after the first ``marker`` starting at ``first`` or later; -1 if none."""
    n = len(marker)
    for i in range(max(0, first), len(tokens) - n + 1):
        if tuple(tokens[i : i + n]) == marker:
            return i + n
    return -1


class ThinkingGate:
    """The thinking phase of the sequence asked about, advanced over its output as it grows.

    Speculation only ever serves a sequence alone in the batch, so the gate follows one sequence at a time: asking
    about another starts its track afresh (a scan of its output so far) and drops the previous one.
    """

    def __init__(self, markers: ThinkingMarkers, *, resume: bool, decode: Any):
        self._markers = markers
        self._resume = resume
        self._decode = decode
        self._track: _Track | None = None

    def allows(self, sequence: Any, prompt: Sequence[int], output: Sequence[int]) -> bool:
        """Whether ``sequence`` may speculate now: ``prompt`` as templated, ``output`` every token of its reply so
        far. ``sequence`` identifies it (compared by identity)."""
        track = self._track
        if track is None or track.sequence is not sequence:
            tail = self._decode(list(prompt[-PROMPT_TAIL_TOKENS:]))
            inside = tail.rstrip().endswith(self._markers.start_text)
            track = self._track = _Track(sequence, Phase.THINKING if inside else Phase.NONE)
        self._advance(track, output)
        return track.phase is Phase.NONE or (track.phase is Phase.ENDED and self._resume)

    @property
    def phase(self) -> Phase | None:
        """The phase of the sequence last asked about."""
        return None if self._track is None else self._track.phase

    def _advance(self, track: _Track, output: Sequence[int]) -> None:
        while True:
            looking_for = self._markers.end if track.phase is Phase.THINKING else self._markers.start
            # a marker may straddle the tokens scanned before and the new ones
            first = max(track.after_marker, track.scanned - len(looking_for) + 1)
            found = _find(output, looking_for, first)
            if found < 0:
                break
            track.phase = Phase.ENDED if track.phase is Phase.THINKING else Phase.THINKING
            track.after_marker = found
        track.scanned = len(output)


def gate_for(cfg: Any, tokenizer: Any) -> ThinkingGate | None:
    """The runner's gate for the served model (None: the model has no thinking block)."""
    markers = ThinkingMarkers.for_model(cfg.model, tokenizer)
    if markers is None:
        return None
    return ThinkingGate(markers, resume=resume_enabled(cfg), decode=tokenizer.decode)
