"""OpenAI's two logprobs shapes, built from the engine's :class:`TokenLogprob` entries.

Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}``.
Legacy completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``.

A token's text is ``tokenizer.decode([id])`` and its ``bytes`` are that text's UTF-8 bytes:
a token holding part of a multi-byte character decodes (and so shows) as U+FFFD.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ...messages import TokenLogprob

#: The lowest logprob reported (vLLM's floor too): JSON has no -Infinity, and a masked
#: token's -inf (or a NaN) must still give a body every client can parse.
MIN_LOGPROB = -9999.0


class TokenDecoder(Protocol):
    def decode(self, token_ids: list[int]) -> str: ...


class LogprobFormatter:
    """Formats logprobs for one response; remembers each token's text while it lives."""

    def __init__(self, tokenizer: TokenDecoder):
        self._tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self._tokenizer.decode([token_id])
        return text

    def chat(self, entries: Iterable[TokenLogprob]) -> dict[str, Any]:
        """Chat's ``choice.logprobs``: the sampled token and exactly its ``top`` alternatives."""
        content = []
        for entry in entries:
            item = self._chat_token(entry.token_id, entry.logprob)
            item["top_logprobs"] = [self._chat_token(t, lp) for t, lp in entry.top]
            content.append(item)
        return {"content": content}

    def completion(self, entries: Iterable[TokenLogprob], text_offset: int) -> tuple[dict[str, Any], int]:
        """Legacy ``choice.logprobs`` and the text offset after these tokens.

        ``text_offset[i]`` is where token i's text starts in the completion: the running sum
        of the tokens' text lengths from ``text_offset`` (so a stream continues across
        chunks). ``top_logprobs[i]`` maps text -> logprob for the top alternatives plus the
        sampled token (OpenAI: "up to logprobs + 1 elements"); tokens with the same text
        share one key, the first (most likely) kept.
        """
        body: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for entry in entries:
            text = self.token_text(entry.token_id)
            top: dict[str, float] = {}
            for token_id, logprob in entry.top:
                top.setdefault(self.token_text(token_id), reportable(logprob))
            top.setdefault(text, reportable(entry.logprob))
            body["tokens"].append(text)
            body["token_logprobs"].append(reportable(entry.logprob))
            body["top_logprobs"].append(top)
            body["text_offset"].append(text_offset)
            text_offset += len(text)
        return body, text_offset

    def _chat_token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": reportable(logprob), "bytes": list(text.encode())}


def reportable(logprob: float) -> float:
    """``logprob`` as a finite JSON number: -inf and NaN become :data:`MIN_LOGPROB`."""
    return float(logprob) if logprob > MIN_LOGPROB else MIN_LOGPROB
