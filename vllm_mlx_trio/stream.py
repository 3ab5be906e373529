"""A request's output as the client sees it: text deltas, stop strings, usage."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from .core.termination import STOP, stop_strings_from
from .core.text import Decoder, StopStringMatcher, make_detokenizer
from .errors import EngineClosedError
from .messages import Accepted, Output, RequestFailed, RequestId, RequestOutput, TokenLogprob
from .metrics import RequestTimer


@attrs.frozen(slots=True, kw_only=True)
class Usage:
    """Token counts, as OpenAI's ``usage`` reports them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    #: Of ``completion_tokens``, those of the reasoning the output parser split out (counted by
    #: the route that parsed the reply; 0 where nothing was split).
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@attrs.frozen(slots=True, kw_only=True)
class Delta:
    """New text (and the tokens behind it); ``finish_reason`` is set on the last delta.

    ``logprobs`` has one entry per token of ``token_ids`` when the request asked for logprobs.
    They belong to the tokens, not to the text: a delta whose text is held back (a split
    UTF-8 character, a possible stop string) still carries its tokens' logprobs.
    """

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


class RequestStream:
    """Async iterator of :class:`Delta` over one request's outbox.

    Closing it (sync, cancel-safe) is how a client aborts: the scheduler hears of it and drops
    the request before its next step. Whoever opens a stream closes it (``with stream:``); one
    dropped unclosed keeps its engine slot and its request runs to its end. A stop string ends
    the stream with ``finish_reason == "stop"`` and closes it the same way; the tokens after the
    one that completed it (an output may carry several) are dropped, with their logprobs. As in
    vLLM, only the text of tokens past the first ``min_tokens`` is searched for stop strings.
    """

    def __init__(
        self,
        request_id: RequestId,
        outbox_recv: trio.MemoryReceiveChannel[Output],
        decoder: Decoder,
        stop: tuple[str, ...],
        *,
        token_bytes: tuple[bytes, ...] | None = None,
        on_close: Callable[[bool], None] | None = None,
        timer: RequestTimer | None = None,
        min_tokens: int = 0,
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ):
        self.request_id = request_id
        self._timer = timer
        self._on_close = on_close
        self._outbox_recv = outbox_recv
        self._detokenizer = make_detokenizer(decoder, token_bytes, skip_special_tokens=skip_special_tokens)
        self._stop = StopStringMatcher(stop, include_stop=include_stop)
        self._min_tokens = min_tokens
        #: vLLM's rule: the token that ended the request (EOS, a stop token id) is counted
        #: but not rendered as text, unless ``include_stop_str_in_output``.
        self._render_stop_token = include_stop
        self._finished = False
        self.num_prompt_tokens = 0
        self.max_tokens = 0
        #: The prompt ended inside the model's thinking block (from admission's Accepted).
        self.starts_in_reasoning = False
        self.num_completion_tokens = 0
        self.num_cached_tokens = 0
        self.finish_reason: str | None = None

    @property
    def usage(self) -> Usage:
        return Usage(
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_completion_tokens,
            cached_tokens=self.num_cached_tokens,
        )

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the output (None: it ended otherwise, or not yet)."""
        return self._stop.matched

    async def wait_accepted(self) -> None:
        """Wait for admission's verdict; raise its error if the request was refused."""
        output = await self._receive()
        if not isinstance(output, Accepted):
            raise AssertionError(f"first output must be Accepted, got {output!r}")
        self.num_prompt_tokens = output.num_prompt_tokens
        self.max_tokens = output.max_tokens
        self.starts_in_reasoning = output.starts_in_reasoning

    def close(self) -> None:
        """Abort (if still running) and release the request's engine slot. Idempotent.

        ``on_close`` is called once, with whether the output had ended (its last delta, an
        error, or the engine's stop) before the close."""
        self._record_finish("abort")
        self._outbox_recv.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self._finished)

    def __enter__(self) -> RequestStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if self._finished:
            raise StopAsyncIteration
        output = await self._receive()
        if not isinstance(output, RequestOutput):
            raise AssertionError(f"unexpected output {output!r}")
        return self._to_delta(output)

    async def _receive(self) -> Output:
        try:
            output = await self._outbox_recv.receive()
        except trio.EndOfChannel:
            self._finished = True
            raise EngineClosedError("The engine stopped before the request finished.") from None
        if isinstance(output, RequestFailed):
            self._finished = True
            self._record_finish("error")
            raise output.error
        return output

    def _record_finish(self, reason: str) -> None:
        """Metrics, once: the first reason wins (a close after the finish changes nothing)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.finish(
                reason,
                prompt_tokens=self.num_prompt_tokens,
                completion_tokens=self.num_completion_tokens,
            )

    def _to_delta(self, output: RequestOutput) -> Delta:
        text, stopped, num_kept = self._text_of(self._rendered_ids(output))
        num_kept = num_kept if stopped else len(output.token_ids)
        token_ids, logprobs = output.token_ids[:num_kept], output.logprobs[:num_kept]
        self.num_completion_tokens += num_kept
        if self._timer is not None:
            self._timer.tokens(num_kept)
        self.num_cached_tokens = output.num_cached_tokens
        finish_reason = "stop" if stopped else output.finish_reason
        if finish_reason is not None:
            self._finished = True
            self.finish_reason = finish_reason
            if not stopped:
                tail, stopped = self._search(self._detokenizer.flush())
                text += tail if stopped else tail + self._stop.flush()
                finish_reason = "stop" if stopped else finish_reason
                self.finish_reason = finish_reason
            self._record_finish(finish_reason)
            self.close()
        return Delta(text=text, token_ids=token_ids, finish_reason=finish_reason, logprobs=logprobs)

    def _rendered_ids(self, output: RequestOutput) -> tuple[int, ...]:
        """The output's tokens whose text is shown: all but a final stop token (see
        ``_render_stop_token``), so ``skip_special_tokens: false`` never shows the EOS."""
        if output.finish_reason == STOP and not self._render_stop_token:
            return output.token_ids[:-1]
        return output.token_ids

    def _text_of(self, token_ids: tuple[int, ...]) -> tuple[str, bool, int]:
        """(text safe to emit, whether a stop string was hit, how many tokens are kept).

        The first ``min_tokens`` tokens' text is never searched; with stop strings, the rest
        is searched token by token, so a hit keeps the tokens up to the one completing it."""
        if not self._stop.active:
            return self._detokenizer.add(token_ids), False, len(token_ids)
        held = stop_strings_from(self._min_tokens, self.num_completion_tokens, len(token_ids))
        text = self._detokenizer.add(token_ids[:held]) if held else ""
        for index in range(held, len(token_ids)):
            piece, stopped = self._stop.feed(self._detokenizer.add(token_ids[index : index + 1]))
            text += piece
            if stopped:
                return text, True, index + 1
        return text, False, len(token_ids)

    def _search(self, text: str) -> tuple[str, bool]:
        """Feed the stop-string matcher, unless the output is still within ``min_tokens``."""
        if self.num_completion_tokens <= self._min_tokens:
            return text, False
        return self._stop.feed(text)
