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
    markup, leading whitespace is held too: dropped if only markup or the end follows, kept
    when text follows markup and text came before it (so the text on both sides stays apart as
    the model wrote it). Text with no markup comes out unchanged.
    """

    def __init__(self, *, after_markup: bool = False) -> None:
        self._held = ""
        self._strip_leading = after_markup
        self._sent_text = False

    def push(self, text: str) -> str:
        if self._strip_leading:
            stripped = text.lstrip()
            self._held += text[: len(text) - len(stripped)]
            if not stripped:
                return ""
            self._strip_leading = False
            if not self._sent_text:
                self._held = ""
            text = stripped
        text = self._held + text
        kept = text.rstrip()
        self._held = text[len(kept) :]
        self._sent_text = self._sent_text or bool(kept)
        return kept

    def markup(self) -> None:
        """Markup came: the held whitespace before it and the whitespace after it are dropped."""
        self._held = ""
        self._strip_leading = True

    def flush(self) -> str:
        """The end of the text: whitespace held after markup is dropped, other held whitespace is text."""
        held, self._held = self._held, ""
        return "" if self._strip_leading else held
