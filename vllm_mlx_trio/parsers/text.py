"""Text helpers of the streaming parsers: held-back partial markers and whitespace next to markup."""

from __future__ import annotations

from collections.abc import Iterable


def partial_marker_len(text: str, markers: Iterable[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``markers``.

    That suffix may be the start of markup still arriving, so it is held back.
    """
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


def find_first(text: str, markers: Iterable[str], start: int = 0) -> tuple[int, str] | None:
    """The earliest occurrence of any of ``markers`` in ``text`` as (index, marker), or None."""
    best: tuple[int, str] | None = None
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, marker)
    return best


class MarkupTrimmer:
    """Drops the whitespace right next to markup, passes every other character through.

    Trailing whitespace is held until more text shows it is not followed by markup; after
    markup, leading whitespace is dropped. Text with no markup comes out unchanged.
    """

    def __init__(self, *, after_markup: bool = False) -> None:
        self._held = ""
        self._strip_leading = after_markup

    def push(self, text: str) -> str:
        if self._strip_leading:
            text = text.lstrip()
            if not text:
                return ""
            self._strip_leading = False
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        return kept

    def markup(self) -> None:
        """Markup came: the held whitespace before it and the whitespace after it are dropped."""
        self._held = ""
        self._strip_leading = True

    def flush(self) -> str:
        """The end of the text with no markup after: the held whitespace is text after all."""
        held, self._held = self._held, ""
        return held
