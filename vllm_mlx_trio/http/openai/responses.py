"""OpenAI response objects and SSE chunks for chat and text completions."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from json.encoder import encode_basestring  # json.dumps(str, ensure_ascii=False), in C
from typing import Any

import attrs

from ...messages import TokenLogprob
from ...stream import Usage
from .logprobs import LogprobFormatter, TokenDecoder


@attrs.frozen(kw_only=True)
class ChoiceResult:
    """One finished choice of a non-streamed response."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: tuple[TokenLogprob, ...] = ()
    #: A chat choice's message fields when its text went through output parsers (content,
    #: reasoning, tool calls: ``agent_output.ChoiceOutput.message``); None: the text is the content.
    message: dict[str, Any] | None = None
    #: Tokens of the reasoning the output parser split out of the text.
    reasoning_tokens: int = 0


class ResponseBuilder:
    """Builds the objects of one response: same id, ``created`` and model throughout.

    With ``logprobs`` (the request asked for them) every choice and chunk carries them in
    the route's shape; a ``tokenizer`` is then required to spell the tokens.
    """

    def __init__(self, *, chat: bool, model: str, logprobs: bool = False, tokenizer: TokenDecoder | None = None):
        if logprobs and tokenizer is None:
            raise ValueError("logprobs need a tokenizer to spell the tokens")
        self.chat = chat
        self.model = model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._formatter = LogprobFormatter(tokenizer) if logprobs and tokenizer is not None else None
        #: Completions' text_offset continues across a choice's chunks: index -> next offset.
        self._text_offsets: dict[int, int] = {}
        #: Per choice, the text chunk's SSE bytes around its text (see :meth:`_text_chunk`).
        self._templates: dict[int, tuple[str, str]] = {}
        #: Chat ``echo`` (vLLM extension): text that opens every choice's content.
        self.echo = ""

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def full(self, choices: Sequence[ChoiceResult], usage: Usage) -> dict[str, Any]:
        """The non-streamed response: every choice, and the usage of them all."""
        body = self._envelope(
            "chat.completion" if self.chat else "text_completion",
            [self._full_choice(choice) for choice in choices],
        )
        body["usage"] = usage_json(usage, chat=self.chat)
        return body

    def _full_choice(self, choice: ChoiceResult) -> dict[str, Any]:
        logprobs = self._logprobs(choice.index, choice.logprobs)
        if self.chat:
            fields = choice.message if choice.message is not None else {"content": choice.text}
            return {
                "index": choice.index,
                "message": {"role": "assistant", **self._echoed(fields)},
                "logprobs": logprobs,
                "finish_reason": choice.finish_reason,
            }
        return {"index": choice.index, "text": choice.text, "logprobs": logprobs, "finish_reason": choice.finish_reason}

    def _echoed(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A chat message's fields with the ``echo`` text opening its content."""
        if not self.echo:
            return fields
        return {**fields, "content": self.echo + (fields.get("content") or "")}

    def role_chunk(self, index: int) -> str:
        """Chat's first chunk of a choice: the assistant role and no content yet (then the
        ``echo`` text in a chunk of its own, as vLLM sends it)."""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
        role = sse(self._envelope("chat.completion.chunk", [choice]))
        return role + self.chunk(index, self.echo) if self.echo else role

    def chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None = None,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> str:
        """One streamed delta of choice ``index``, with its tokens' logprobs if asked."""
        if finish_reason is None and text and self._formatter is None:
            return self._text_chunk(index, text)
        logprobs_json = self._logprobs(index, logprobs) if logprobs else None
        if self.chat:
            delta: dict[str, Any] = {} if finish_reason is not None and not text else {"content": text}
            choice = {"index": index, "delta": delta, "logprobs": logprobs_json, "finish_reason": finish_reason}
            return sse(self._envelope("chat.completion.chunk", [choice]))
        choice = {"index": index, "text": text, "logprobs": logprobs_json, "finish_reason": finish_reason}
        return sse(self._envelope("text_completion", [choice]))

    def _text_chunk(self, index: int, text: str) -> str:
        """The per-token chunk (text, no finish, no logprobs): the bytes :func:`sse` gives,
        from a template made once per choice, so only the text is encoded per token."""
        template = self._templates.get(index)
        if template is None:
            choice: dict[str, Any]
            if self.chat:
                choice = {"index": index, "delta": {"content": _TEXT_MARK}, "logprobs": None, "finish_reason": None}
            else:
                choice = {"index": index, "text": _TEXT_MARK, "logprobs": None, "finish_reason": None}
            kind = "chat.completion.chunk" if self.chat else "text_completion"
            head, _, tail = sse(self._envelope(kind, [choice])).rpartition(encode_basestring(_TEXT_MARK))
            template = self._templates[index] = (head, tail)
        return template[0] + encode_basestring(text) + template[1]

    def delta_chunk(
        self,
        index: int,
        delta: dict[str, Any],
        finish_reason: str | None = None,
        logprobs: tuple[TokenLogprob, ...] = (),
    ) -> str:
        """A chat chunk of choice ``index`` carrying a parsed delta (reasoning, content or
        tool-call pieces: ``agent_output``), with its tokens' logprobs if asked. A delta of
        content alone, the common one, comes from the choice's template (:meth:`_text_chunk`)."""
        if finish_reason is None and self._formatter is None and len(delta) == 1 and delta.get("content"):
            return self._text_chunk(index, delta["content"])
        logprobs_json = self._logprobs(index, logprobs) if logprobs else None
        choice = {"index": index, "delta": delta, "logprobs": logprobs_json, "finish_reason": finish_reason}
        return sse(self._envelope("chat.completion.chunk", [choice]))

    def usage_chunk(self, usage: Usage) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        body = self._envelope(kind, [])
        body["usage"] = usage_json(usage, chat=self.chat)
        return sse(body)

    def _logprobs(self, index: int, entries: tuple[TokenLogprob, ...]) -> dict[str, Any] | None:
        if self._formatter is None:
            return None
        if self.chat:
            return self._formatter.chat(entries)
        body, self._text_offsets[index] = self._formatter.completion(entries, self._text_offsets.get(index, 0))
        return body


def combined_usage(usages: Sequence[Usage]) -> Usage:
    """The usage of n choices of one prompt: the prompt counted once (as OpenAI does)."""
    first = usages[0]
    return Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=first.cached_tokens,
        reasoning_tokens=sum(u.reasoning_tokens for u in usages),
    )


def usage_json(usage: Usage, *, chat: bool = False) -> dict[str, Any]:
    """OpenAI's ``usage``; a chat reply's also has ``completion_tokens_details.reasoning_tokens``."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }
    if chat:
        body["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return body


#: Stands for the text in a chunk template; the last occurrence is the text's (choices come
#: after the model name in the envelope).
_TEXT_MARK = "\ue000text\ue000"


def sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"
