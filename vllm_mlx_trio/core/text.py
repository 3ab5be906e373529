"""Turning token ids into streamed text: incremental detokenizing and stop strings. Pure."""

from __future__ import annotations

import codecs
import json
from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Emit text as tokens arrive, never a half-decoded UTF-8 character.

    Decodes a short window (``prefix_offset:``) and subtracts the text of the part already
    emitted, so tokenizers whose decode depends on the left context (SentencePiece's leading
    space, byte-level merges) still stream the same text as a whole decode.
    """

    def __init__(self, decoder: Decoder, *, skip_special_tokens: bool = True):
        self._decoder = decoder
        self._skip_special_tokens = skip_special_tokens
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
        return self._decoder.decode(self._token_ids[start:end], skip_special_tokens=self._skip_special_tokens)


class ByteLevelDetokenizer:
    """Streaming text for byte-level BPE tokenizers (GPT-2, Llama 3, Qwen): every token is a
    fixed byte string, so the text is an incremental UTF-8 decode of their concatenation.

    Same output as :class:`IncrementalDetokenizer` at a fraction of the cost: one table
    lookup per token instead of two tokenizer decodes per delta. A character split across
    tokens is held back; invalid bytes become U+FFFD, as the tokenizer's own decode does.
    """

    def __init__(self, token_bytes: Sequence[bytes]):
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_ids: tuple[int, ...] | list[int]) -> str:
        table = self._token_bytes
        return self._utf8.decode(b"".join([table[t] for t in token_ids]))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)


def make_detokenizer(
    decoder: Decoder, token_bytes: Sequence[bytes] | None, *, skip_special_tokens: bool = True
) -> IncrementalDetokenizer | ByteLevelDetokenizer:
    """The fast byte-level detokenizer when the tokenizer has a byte table, else the general one
    (also when special tokens are to be kept: the byte table holds them as empty)."""
    if token_bytes is not None and skip_special_tokens:
        return ByteLevelDetokenizer(token_bytes)
    return IncrementalDetokenizer(decoder, skip_special_tokens=skip_special_tokens)


def byte_level_table(tokenizer: Any) -> tuple[bytes, ...] | None:
    """Each token id's bytes (special tokens: empty, as they are skipped), or None when the
    tokenizer is not plain byte-level BPE and the general detokenizer must be used."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or getattr(hf, "clean_up_tokenization_spaces", False):
        return None
    if json.loads(backend.to_str()).get("decoder", {}).get("type") != "ByteLevel":
        return None
    added = {i: t for i, t in hf.added_tokens_decoder.items()}
    vocab = backend.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    byte_of = {c: b for b, c in _bytes_to_unicode().items()}
    for text, token_id in vocab.items():
        if token_id in added:
            table[token_id] = b"" if added[token_id].special else added[token_id].content.encode()
        elif all(c in byte_of for c in text):
            table[token_id] = bytes(byte_of[c] for c in text)
        else:
            return None
    return tuple(table)


def with_special_markup(table: Sequence[bytes], tokenizer: Any, markup: frozenset[str]) -> tuple[bytes, ...]:
    """``table`` with the special tokens whose text is in ``markup`` spelled out instead of
    skipped: output parsers read markup that many models write as special tokens (Llama's
    ``<|python_tag|>``, Mistral's ``[TOOL_CALLS]``, gpt-oss's harmony channels)."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    added = getattr(hf, "added_tokens_decoder", {})
    kept = {i: t.content.encode() for i, t in added.items() if t.special and t.content in markup and i < len(table)}
    if not kept:
        return tuple(table)
    return tuple(kept.get(i, b) for i, b in enumerate(table))


def keeping_special_markup(tokenizer: Any, markup: frozenset[str]) -> Decoder:
    """``tokenizer``'s decoding with the special tokens whose text is in ``markup`` kept, for
    tokenizers without a byte table (SentencePiece: Mistral v0.3's ``[TOOL_CALLS]``); as
    :func:`with_special_markup` does for byte tables. ``tokenizer`` itself if it has none of them."""
    wrapped = getattr(tokenizer, "_tokenizer", None)  # mlx-lm's wrapper holds the Hugging Face tokenizer
    hf = wrapped if hasattr(wrapped, "added_tokens_decoder") else tokenizer
    added = getattr(hf, "added_tokens_decoder", {})
    kept = frozenset(i for i, t in added.items() if t.special and t.content in markup)
    if not kept:
        return tokenizer
    special = {i for i, t in added.items() if t.special} | set(getattr(hf, "all_special_ids", ()))
    return MarkupKeepingDecoder(tokenizer, skipped=frozenset(special - kept))


class MarkupKeepingDecoder:
    """Decodes as ``decoder`` does, but skipping special tokens skips only ``skipped`` (the others,
    the parsers' markup, are spelled out)."""

    def __init__(self, decoder: Decoder, *, skipped: frozenset[int]):
        self._decoder = decoder
        self._skipped = skipped

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            token_ids = [t for t in token_ids if t not in self._skipped]
        return self._decoder.decode(token_ids, skip_special_tokens=False)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, used by every byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


class StopStringMatcher:
    """Find stop strings across chunk boundaries; emitted text never contains one (unless
    ``include_stop``: then it ends with the stop string that matched).

    Text that could be the start of a stop string is held back until it is ruled out.
    """

    def __init__(self, stop: tuple[str, ...], *, include_stop: bool = False):
        self._stop = stop
        self._include_stop = include_stop
        self._pending = ""
        #: The stop string that ended the text (the earliest in it; ties: the first listed).
        self.matched: str | None = None

    @property
    def active(self) -> bool:
        """Whether there are stop strings to look for at all."""
        return bool(self._stop)

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        if not self._stop:
            return text, False
        self._pending += text
        hits = [(i, i + len(s), s) for s in self._stop if (i := self._pending.find(s)) >= 0]
        if hits:
            start, end, self.matched = min(hits, key=lambda hit: hit[0])
            emit = self._pending[: end if self._include_stop else start]
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
