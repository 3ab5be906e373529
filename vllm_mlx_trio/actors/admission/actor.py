"""AdmissionActor: template, tokenize and check each request against the model's limits.

A request that can never be served is refused here, before it takes a queue slot; one that
passes gets :class:`Accepted` on its outbox and moves on to the scheduler.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from functools import partial

import attrs
import trio

from ...core.params import SamplingParams
from ...errors import InvalidRequestError, PromptTooLongError, VllmMlxTrioError
from ...messages import Accepted, Admit, ChatPrompt, Outbox, RequestFailed, Submit
from ...output_format import OutputFormat
from ...parsers import prompt_ends_in_reasoning
from ...structured.admission import ConstraintStep
from .chat_template import (
    ChatTemplateOptions,
    Prompt,
    Tokenizer,
    as_prompt,
    call_tokenizer,
    has_media,
    prompt_chars,
    render_prompt,
    tokenize_prompt,
)
from .media import MediaLoader, MediaPrompt, PromptProcessor, process_media_prompt, tool_media_placeholders

logger = logging.getLogger(__name__)

#: Prompt tokens decoded to tell whether the chat template left the prompt inside a thinking
#: block (an opener like ``<think>\n`` is a few tokens; 16 leave room for any whitespace).
REASONING_TAIL_TOKENS = 16
#: Prompts with fewer characters than this (all turns' text together) are templated and
#: tokenized inline: under a millisecond of the event loop (demo tokenizer on a 2-core CPU box:
#: 0.4 ms for 256 characters, 0.9 ms for 1,024, 3.5 ms for 4,096), where a thread hop itself
#: costs 0.15-0.3 ms. Longer prompts go to a preprocessing thread.
PREPROCESS_INLINE_CHARS = 1024


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
    #: Media content-part kinds the model takes ("image_url", "video_url"); none: text only.
    media_kinds: frozenset[str] = frozenset()
    #: Why this model's media are refused although it declares a tower (ModelInfo.text_only_note).
    text_only_note: str | None = None
    #: A tool turn's media the model cannot take becomes a short text (limits.tool_result_media
    #: "placeholder"); False: a 400, as for the user's own.
    tool_media_placeholders: bool = True
    #: False for an embedding model (engine.mode = "embed"): it generates no text.
    generates: bool = True
    #: A max_tokens past the room left is lowered to it (limits.clamp_max_tokens), not a 400.
    clamp_max_tokens: bool = False
    #: The named adapters a request may run with (model.adapters); another is a 400 (HTTP routes
    #: answer an unknown adapter name with a 404 before admission).
    adapters: frozenset[str] = frozenset()


class AdmissionActor:
    """Turns :class:`Submit` into :class:`Admit`, or into a :class:`RequestFailed` reply.

    Templating and tokenizing a long prompt takes milliseconds to seconds of CPU: it runs in
    ``trio.to_thread.run_sync``, at most ``preprocess_threads`` prompts at once (0: inline on
    the event loop, stalling every stream meanwhile; kept to measure the difference). Each
    thread works on a tokenizer copy of its own (docs/architecture.md, "Who owns the
    tokenizer"). Prompts start preprocessing in arrival order; with one thread they reach the
    scheduler in that order too, with more a short prompt may overtake a long one.
    """

    def __init__(
        self,
        *,
        submit_recv: trio.MemoryReceiveChannel[Submit],
        admit_send: trio.MemorySendChannel[Admit],
        tokenizer: Tokenizer,
        limits: AdmissionLimits,
        preprocess_threads: int = 1,
        constraints: ConstraintStep | None = None,
        output_format: OutputFormat | None = None,
        media_loader: MediaLoader | None = None,
        media_processor: PromptProcessor | None = None,
        on_media: Callable[[MediaPrompt], None] | None = None,
    ):
        self._submit_recv = submit_recv
        self._admit_send = admit_send
        self._tokenizer = tokenizer
        self._limits = limits
        self._threads = preprocess_threads
        self._limiter = trio.CapacityLimiter(max(1, preprocess_threads))
        #: A VLM's media path (actors/admission/media.py): the loader and the model's prompt processor.
        self._media_loader = media_loader
        self._media_processor = media_processor
        #: Called with each media prompt once preprocessed (metrics: counts and seconds).
        self._on_media = on_media
        #: Tokenizer copies no thread is using (one per thread, made when the actor starts).
        self._free_tokenizers: list[Tokenizer] = []
        #: The model's output parsers; its reasoning markers let a constraint allow the
        #: thinking block first, and tell whether a prompt starts the reply inside it.
        self._output_format = output_format or OutputFormat()
        #: Compiles response_format / guided / forced tool-call constraints (structured/).
        self._constraints = constraints or ConstraintStep(
            vocab_size=limits.vocab_size,
            eos_token_ids=tuple(sorted(getattr(tokenizer, "eos_token_ids", None) or ())),
            reasoning_markers=self._output_format.reasoning_markers,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Admit until the engine facade closes the submit channel, then let the requests
        still in preprocessing finish."""
        with self._submit_recv, self._admit_send:
            # Once, at engine start (before any request; in the loop, not a thread: a test's
            # autojump clock would jump past a thread it cannot see).
            self._free_tokenizers = self._copy_tokenizers()
            async with trio.open_nursery() as nursery:
                task_status.started()
                async for submit in self._submit_recv:
                    if self._threads == 0:
                        await self._admit(submit, None, in_thread=False)
                        continue
                    # Every request takes a token here, in arrival order (tasks start in no
                    # set order), even a short one done inline: with one thread nothing
                    # overtakes a long prompt. The token is given back once it is tokenized.
                    borrower = object()
                    await self._limiter.acquire_on_behalf_of(borrower)
                    if prompt_chars(submit.prompt) < PREPROCESS_INLINE_CHARS and not has_media(submit.prompt):
                        await self._admit(submit, borrower, in_thread=False)
                    else:
                        nursery.start_soon(partial(self._admit, submit, borrower, in_thread=True))

    def _copy_tokenizers(self) -> list[Tokenizer]:
        try:
            return [copy.deepcopy(self._tokenizer) for _ in range(self._threads)]
        except Exception as exc:  # boundary: a tokenizer class that cannot be copied
            logger.warning("tokenizer cannot be copied (%s); preprocessing threads share it", exc)
            return [self._tokenizer] * self._threads

    async def _admit(self, submit: Submit, borrower: object | None, *, in_thread: bool) -> None:
        """Preprocess and check one request. Its outbox is closed here unless the scheduler
        gets it (refused, client gone, or cancelled at shutdown)."""
        outbox = submit.outbox
        prompt = as_prompt(submit.prompt)
        if self._limits.tool_media_placeholders and isinstance(prompt, ChatPrompt):
            prompt = tool_media_placeholders(prompt, self._limits.media_kinds)
        with contextlib.ExitStack() as owned:
            owned.callback(outbox.close)
            try:
                preprocessed = await self._preprocess(prompt, submit.params, outbox, borrower, in_thread=in_thread)
                if preprocessed is None:
                    return  # the client left before its turn: never tokenized
                media = preprocessed if isinstance(preprocessed, MediaPrompt) else None
                prompt_token_ids = media.token_ids if media is not None else preprocessed
                params = self.resolve_params(submit.params, len(prompt_token_ids))
                params = await self._compile_constraint(params, prompt_token_ids)
            except VllmMlxTrioError as exc:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    outbox.send_nowait(RequestFailed(error=exc))  # else the client left: nobody to tell
                return
            starts_in_reasoning = self.starts_in_reasoning(prompt, prompt_token_ids)
            if params.thinking_budget is not None:  # the budget counts from the block the template opened
                budget = attrs.evolve(params.thinking_budget, starts_inside=starts_in_reasoning)
                params = attrs.evolve(params, thinking_budget=budget)
            try:
                accepted = Accepted(
                    num_prompt_tokens=len(prompt_token_ids),
                    max_tokens=params.max_tokens,
                    starts_in_reasoning=starts_in_reasoning,
                )
                outbox.send_nowait(accepted)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return  # the client left while we tokenized: never reaches the queue
            admit = Admit(
                request_id=submit.request_id,
                prompt_token_ids=tuple(prompt_token_ids),
                params=params,
                outbox=outbox,
                arrival_time=submit.arrival_time,
                endpoint=submit.endpoint,
                media=media.media if media is not None else (),
                media_keys=media.media_keys if media is not None else (),
            )
            if media is not None and self._on_media is not None:
                self._on_media(media)
            await self._admit_send.send(admit)
            owned.pop_all()  # the scheduler owns the outbox now

    async def _preprocess(
        self, prompt: Prompt, params: SamplingParams, outbox: Outbox, borrower: object | None, *, in_thread: bool
    ) -> list[int] | MediaPrompt | None:
        """The prompt's token ids (None: the client left first), here or in a thread; a
        prompt with media always in a thread, as a :class:`MediaPrompt`.
        ``borrower`` holds a limiter token (None: ``preprocess_threads = 0``)."""
        template = ChatTemplateOptions.of(params)
        try:
            self.check_generates()
            self.check_media(prompt)
            media = has_media(prompt)
            if not in_thread and not media:
                return self.tokenize(prompt, template)
            if outbox.statistics().open_receive_channels == 0:
                return None
            tokenizer = self._free_tokenizers.pop() if self._free_tokenizers else self._tokenizer
            try:
                # Not abandoned on cancel: the copy goes back to the pool only once unused.
                if media:
                    return await trio.to_thread.run_sync(self._process_media, tokenizer, prompt, template)
                return await trio.to_thread.run_sync(tokenize_prompt, tokenizer, prompt, template)
            finally:
                if tokenizer is not self._tokenizer:
                    self._free_tokenizers.append(tokenizer)
        finally:
            # Given back before the Accepted and Admit sends, which put before they yield:
            # with one thread the next prompt cannot reach the scheduler before this one.
            if borrower is not None:
                self._limiter.release_on_behalf_of(borrower)

    async def _compile_constraint(self, params: SamplingParams, prompt_token_ids: list[int]) -> SamplingParams:
        """Compile the request's output constraint in a preprocessing thread, with its tokenizer
        copy (inline with ours when preprocess_threads = 0)."""
        if params.constraint is None:
            return params
        if self._threads == 0:
            return self._constraints.attach(params, prompt_token_ids, self._tokenizer)
        async with self._limiter:
            tokenizer = self._free_tokenizers.pop()
            try:
                return await trio.to_thread.run_sync(self._constraints.attach, params, prompt_token_ids, tokenizer)
            finally:
                self._free_tokenizers.append(tokenizer)

    def _process_media(self, tokenizer: Tokenizer, prompt: ChatPrompt, template: ChatTemplateOptions) -> MediaPrompt:
        """(In a preprocessing thread.) Load the media, template, expand and tokenize."""
        assert self._media_loader is not None and self._media_processor is not None, "check_media refuses media"
        return process_media_prompt(
            self._media_loader,
            self._media_processor,
            lambda p: render_prompt(tokenizer, p, template),
            lambda text: call_tokenizer(lambda: tokenizer.encode(text, add_special_tokens=False), "messages"),
            prompt,
        )

    def check_generates(self) -> None:
        """Refuse every generation request on an embedding model (before tokenizing)."""
        if not self._limits.generates:
            raise InvalidRequestError(
                "This model is an embedding model: it generates no text. Use /v1/embeddings.", param="model"
            )

    def check_media(self, prompt: Prompt) -> None:
        """Refuse content parts of kinds this model does not take (a text-only model: all)."""
        if isinstance(prompt, str):
            return
        for i, message in enumerate(prompt):
            for j, part in message.media:
                if part.kind not in self._limits.media_kinds:
                    where = f"messages[{i}].content[{j}]"
                    note = f" {self._limits.text_only_note}" if self._limits.text_only_note else ""
                    message = f"{where}: content part of type {part.kind!r} is not supported by this model.{note}"
                    raise InvalidRequestError(message, param=where)

    def starts_in_reasoning(self, prompt: Prompt, prompt_token_ids: list[int]) -> bool:
        """Whether a chat prompt's template opened the thinking block (the reply is reasoning
        until it closes it). Completions are never parsed."""
        name = self._output_format.reasoning_parser
        if name is None or isinstance(prompt, str):
            return False
        tail = self._tokenizer.decode(list(prompt_token_ids[-REASONING_TAIL_TOKENS:]))
        return prompt_ends_in_reasoning(name, tail)

    def tokenize(self, prompt: Prompt, template: ChatTemplateOptions | None = None) -> list[int]:
        """Apply the chat template (for chat turns) and tokenize, here and now."""
        return tokenize_prompt(self._tokenizer, prompt, template)

    def resolve_params(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """Check the prompt fits and settle ``max_tokens`` (default: the room left)."""
        params.check(max_stop_sequences=self._limits.max_stop_sequences)
        params.check_token_ids(self._limits.vocab_size)
        if params.adapter is not None and params.adapter not in self._limits.adapters:
            served = ", ".join(sorted(self._limits.adapters)) or "none"
            raise InvalidRequestError(
                f"adapter {params.adapter!r} is not served (model.adapters: {served}).", param="model"
            )
        resolved = self._resolve_max_tokens(params, num_prompt_tokens)
        if resolved.min_tokens > resolved.max_tokens:
            raise InvalidRequestError(
                f"min_tokens ({resolved.min_tokens}) must not exceed max_tokens ({resolved.max_tokens}).",
                param="min_tokens",
            )
        return resolved

    def _resolve_max_tokens(self, params: SamplingParams, num_prompt_tokens: int) -> SamplingParams:
        """vLLM's rule and words: the prompt must leave room for one token, and
        prompt + ``max_tokens`` must fit the context (``model.max_model_len`` when set)."""
        limit = self._max_tokens_per_request()
        room = limit - num_prompt_tokens
        if room < 1:
            raise PromptTooLongError(
                f"This model's maximum context length is {limit} tokens. However, your request has "
                f"{num_prompt_tokens} input tokens. Please reduce the length of the input messages."
                + self._kv_budget_note()
            )
        if params.max_tokens is None:
            default = self._limits.default_max_tokens
            return attrs.evolve(params, max_tokens=min(default, room) if default else room)
        if params.max_tokens > room and self._limits.clamp_max_tokens:
            return attrs.evolve(params, max_tokens=room)
        if params.max_tokens > room:
            raise PromptTooLongError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {params.max_tokens}. This model's "
                f"maximum context length is {limit} tokens and your request has {num_prompt_tokens} input "
                f"tokens ({params.max_tokens} > {limit} - {num_prompt_tokens})." + self._kv_budget_note(),
                param="max_tokens",
            )
        return params

    def _max_tokens_per_request(self) -> int:
        """Prompt + completion tokens one request may have: the context or the KV budget."""
        kv = self._limits.kv_budget_tokens
        context = self._limits.max_context_tokens
        return context if kv is None else min(context, kv)

    def _kv_budget_note(self) -> str:
        """Why the limit is below the model's context, when the KV budget is what binds."""
        context, kv = self._limits.max_context_tokens, self._limits.kv_budget_tokens
        if kv is None or kv >= context:
            return ""
        return (
            f" (The model's context is {context} tokens; this server's KV cache budget "
            f"(engine.kv_memory_mb) holds {kv} tokens for one request.)"
        )
