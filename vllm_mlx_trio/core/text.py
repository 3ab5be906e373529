"""Turning token ids into streamed text: incremental detokenizing and stop strings. Pure."""

from __future__ import annotations

from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Emit text as tokens arrive, never a half-decoded UTF-8 character.

    Decodes a short window (``prefix_offset:``) and subtracts the text of the part already
    emitted, so tokenizers whose decode depends on the left context (SentencePiece's leading
    space, byte-level merges) still stream the same text as a whole decode.
    """

    def __init__(self, decoder: Decoder):
        self._decoder = decoder
        self._token_ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def add(self, token_ids: tuple[int, ...] | list[int]) -> str:
        """Add tokens; return the text they complete (may be empty while a char is split)."""
        self._token_ids.extend(token_ids)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._token_ids))
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """The text still held back (a trailing incomplete character decodes as U+FFFD)."""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset, len(self._token_ids))
        self._prefix_offset = self._read_offset = len(self._token_ids)
        return full_text[len(prefix_text) :]

    def _decode(self, start: int, end: int) -> str:
        if start >= end:
            return ""
        return self._decoder.decode(self._token_ids[start:end], skip_special_tokens=True)


class StopStringMatcher:
    """Find stop strings across chunk boundaries; emitted text never contains one.

    Text that could be the start of a stop string is held back until it is ruled out.
    """

    def __init__(self, stop: tuple[str, ...]):
        self._stop = stop
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        if not self._stop:
            return text, False
        self._pending += text
        hits = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        if hits:
            emit = self._pending[: min(hits)]
            self._pending = ""
            return emit, True
        keep = self._longest_partial_suffix()
        cut = len(self._pending) - keep
        emit, self._pending = self._pending[:cut], self._pending[cut:]
        return emit, False

    def flush(self) -> str:
        """Release what was held back (the stream ended without a stop)."""
        text, self._pending = self._pending, ""
        return text

    def _longest_partial_suffix(self) -> int:
        pending = self._pending
        for size in range(min(len(pending), max(map(len, self._stop)) - 1), 0, -1):
            suffix = pending[-size:]
            if any(s.startswith(suffix) for s in self._stop):
                return size
        return 0
