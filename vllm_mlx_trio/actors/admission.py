"""AdmissionActor: template, tokenize and check each request against the model's limits.

A request that can never be served is refused here, before it takes a queue slot; one that
passes gets :class:`Accepted` on its outbox and moves on to the scheduler.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import attrs
import trio

from ..core.params import SamplingParams
from ..errors import InvalidRequestError, PromptTooLongError, VllmMlxTrioError
from ..messages import Accepted, Admit, ChatMessage, RequestFailed, Submit

logger = logging.getLogger(__name__)


class Tokenizer(Protocol):
    """What admission and detokenization need from a tokenizer (mlx-lm's TokenizerWrapper)."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> Any: ...


@attrs.frozen(kw_only=True)
class AdmissionLimits:
    """The numbers admission checks a request against."""

    max_context_tokens: int
    #: Tokens of KV the running sequences may hold together; one request may use them all.
    kv_budget_tokens: int | None = None
    default_max_tokens: int | None
    max_stop_sequences: int
    #: Token ids a request names (stop_token_ids, logit_bias) must be below this.
    vocab_size: int


class AdmissionActor:
    """Turns :class:`Submit` into :class:`Admit`, or into a :class:`RequestFailed` reply."""

    def __init__(
        self,
        *,
        submit_recv: trio.MemoryReceiveChannel[Submit],
        admit_send: trio.MemorySendChannel[Admit],
        tokenizer: Tokenizer,
        limits: AdmissionLimits,
    ):
        self._submit_recv = submit_recv
        self._admit_send = admit_send
        self._tokenizer = tokenizer
        self._limits = limits

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Admit until the engine facade closes the submit channel."""
        with self._submit_recv, self._admit_send:
            task_status.started()
            async for submit in self._submit_recv:
                await self._admit(submit)

    async def _admit(self, submit: Submit) -> None:
        outbox = submit.outbox
        try:
            prompt_token_ids = self.tokenize(submit.prompt)
            params = self.resolve_params(submit.params, len(prompt_token_ids))
        except VllmMlxTrioError as exc:
            with outbox:
                try:
                    outbox.send_nowait(RequestFailed(error=exc))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the client left before its answer: nobody to tell
            return
        try:
            outbox.send_nowait(
                Accepted(num_prompt_tokens=len(prompt_token_ids), max_tokens=params.max_tokens)
            )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            outbox.close()  # the client left while we tokenized: never reaches the queue
            return
        await self._admit_send.send(
            Admit(
                request_id=submit.request_id,
                prompt_token_ids=tuple(prompt_token_ids),
                params=params,
                outbox=outbox,
                arrival_time=submit.arrival_time,
            )
        )

    def tokenize(self, prompt: str | tuple[ChatMessage, ...]) -> list[int]:
        """Apply the chat template (for chat turns) and tokenize; errors become 400s."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("The prompt must not be empty.", param="prompt")
            return self._call_tokenizer(lambda: self._tokenizer.encode(prompt), "prompt")
        if not prompt:
            raise InvalidRequestError("messages must not be empty.", param="messages")
        turns = [_turn(m) for m in prompt]
        text = self._call_tokenizer(
            lambda: self._tokenizer.apply_chat_template(
                turns, add_generation_prompt=True, tokenize=False
            ),
            "messages",
        )
        return self._call_tokenizer(
            lambda: self._tokenizer.encode(text, add_special_tokens=False), "messages"
        )

    @staticmethod
    def _call_tokenizer(fn: Any, param: str) -> Any:
        try:
            return fn()
        except Exception as exc:  # boundary: tokenizer / Jinja errors are the request's fault
            raise InvalidRequestError(
                f"Could not process {param}: {type(exc).__name__}: {exc}", param=param
            ) from exc

    def resolve_params(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """Check the prompt fits and settle ``max_tokens`` (default: the room left)."""
        params.check(max_stop_sequences=self._limits.max_stop_sequences)
        params.check_token_ids(self._limits.vocab_size)
        resolved = self._resolve_max_tokens(params, num_prompt_tokens)
        if resolved.min_tokens > resolved.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({resolved.min_tokens}) must not exceed max_tokens "
                f"({resolved.max_tokens}).",
                param="min_tokens",
            )
        return resolved

    def _resolve_max_tokens(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        room = self._max_tokens_per_request() - num_prompt_tokens
        if room < 1:
            raise PromptTooLongError(
                f"{self._limit_text()} However, your prompt has {num_prompt_tokens} tokens, "
                "which leaves no room for a completion."
            )
        if params.max_tokens is None:
            default = self._limits.default_max_tokens
            return attrs.evolve(params, max_tokens=min(default, room) if default else room)
        if params.max_tokens > room:
            raise PromptTooLongError(
                f"{self._limit_text()} However, you requested "
                f"{num_prompt_tokens + params.max_tokens} tokens ({num_prompt_tokens} in the "
                f"prompt, {params.max_tokens} for the completion).",
                param="max_tokens",
            )
        return params

    def _max_tokens_per_request(self) -> int:
        """Prompt + completion tokens one request may have: the context or the KV budget."""
        kv = self._limits.kv_budget_tokens
        context = self._limits.max_context_tokens
        return context if kv is None else min(context, kv)

    def _limit_text(self) -> str:
        """The first sentence of a too-long refusal (OpenAI's wording, then our KV budget)."""
        context = self._limits.max_context_tokens
        text = f"This model's maximum context length is {context} tokens."
        kv = self._limits.kv_budget_tokens
        if kv is not None and kv < context:
            text = (
                f"This model's maximum context length is {context} tokens, but this server's "
                f"KV cache budget (engine.kv_memory_mb) holds {kv} tokens for one request."
            )
        return text


def _turn(message: ChatMessage) -> dict[str, str]:
    """One message as chat templates expect it (``name`` only when the client gave one)."""
    turn = {"role": message.role, "content": message.content}
    if message.name is not None:
        turn["name"] = message.name
    return turn
