"""A request's life inside the scheduler: status, tokens so far, what is not yet delivered."""

from __future__ import annotations

import enum
from typing import Any, Protocol

from .params import SamplingParams
from .plan import RequestId, TokenLogprob
from .termination import LENGTH, STOP, Termination


class Outbox(Protocol):
    """The request's reply channel as the scheduler uses it (a Trio ``MemorySendChannel``)."""

    def send_nowait(self, value: Any) -> None: ...

    def close(self) -> None: ...

    def statistics(self) -> Any: ...


class Admitted(Protocol):
    """What the scheduler is handed for a new request (``messages.Admit``)."""

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    outbox: Outbox
    arrival_time: float
    media_keys: tuple[tuple[int, str], ...]

    @property
    def cache_keys(self) -> tuple: ...


class RequestStatus(enum.IntEnum):
    """Ordered: every status >= FINISHED_STOPPED is final."""

    WAITING = 0
    RUNNING = 1
    FINISHED_STOPPED = 2
    FINISHED_LENGTH = 3
    FINISHED_ABORTED = 4
    FINISHED_ERROR = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_STOPPED


#: OpenAI finish_reason for each final status that has one.
FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: STOP,
    RequestStatus.FINISHED_LENGTH: LENGTH,
}
FINISH_STATUSES = {reason: status for status, reason in FINISH_REASONS.items()}


class Request:
    """Mutable per-request state, owned by the scheduler alone."""

    __slots__ = (
        "request_id",
        "prompt_token_ids",
        "params",
        "cache_keys",
        "media_keys",
        "outbox",
        "arrival_time",
        "status",
        "num_output_tokens",
        "num_cached_tokens",
        "num_delivered",
        "scheduled_time",
        "first_token_time",
        "undelivered",
        "undelivered_logprobs",
        "output_token_ids",
        "num_preemptions",
        "first_valid_step",
        "termination",
        "endpoint",
        "media",
    )

    def __init__(self, admit: Admitted, eos_token_ids: tuple[int, ...]):
        self.request_id: RequestId = admit.request_id
        self.prompt_token_ids = admit.prompt_token_ids
        self.params: SamplingParams = admit.params
        #: Extra keys of its prefix-cache blocks: the cache salt and the media hashes.
        self.cache_keys: tuple = admit.cache_keys
        #: The prompt's images and videos for the runner (``messages.MediaInput``), if any.
        self.media: tuple = getattr(admit, "media", ())
        #: ((start position, cache key), ...) of its media, for the prefix cache's block hashes.
        self.media_keys: tuple[tuple[int, str], ...] = admit.media_keys
        self.outbox: Outbox = admit.outbox
        self.arrival_time = admit.arrival_time
        #: The HTTP route it came from (the ``endpoint`` label of the queue/prefill/decode times).
        self.endpoint: str = getattr(admit, "endpoint", "")
        self.status = RequestStatus.WAITING
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.num_delivered = 0
        #: When the request entered the batch, and when its first token came back (or None).
        self.scheduled_time: float | None = None
        self.first_token_time: float | None = None
        #: Sampled tokens not yet handed to the client (coalesced while its outbox is full
        #: or until ``stream_interval`` tokens are ready), and their logprobs if asked for.
        self.undelivered: list[int] = []
        self.undelivered_logprobs: list[TokenLogprob] = []
        #: Every token produced so far: a preempted request is recomputed from prompt + these.
        self.output_token_ids: list[int] = []
        self.num_preemptions = 0
        #: Results of steps before this one belong to an earlier (preempted) run: ignored.
        self.first_valid_step = 0
        #: When generation ends (shared with the runners: core/termination.py).
        self.termination = Termination.of(admit.params, eos_token_ids)

    @property
    def max_tokens(self) -> int:
        assert self.params.max_tokens is not None, "admission resolves max_tokens"
        return self.params.max_tokens

    @property
    def num_tokens(self) -> int:
        """Tokens of KV this request holds once it has run: prompt + output so far."""
        return len(self.prompt_token_ids) + self.num_output_tokens

    @property
    def all_token_ids(self) -> tuple[int, ...]:
        """Prompt + output so far: what a preempted request is recomputed from."""
        return self.prompt_token_ids + tuple(self.output_token_ids)

    @property
    def phase(self) -> str:
        """queued, preempted (back in the queue), prefill (in the batch, no token yet), decode,
        or finished."""
        if self.status.is_finished:
            return "finished"
        if self.status == RequestStatus.WAITING:
            return "preempted" if self.num_preemptions else "queued"
        return "decode" if self.num_output_tokens else "prefill"

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)

    def append_tokens(self, token_ids: tuple[int, ...], logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        """Record one step's accepted tokens (k >= 1 of them), stopping by :class:`Termination`.

        Tokens after the one that ends the request are dropped, and their logprobs. A stop
        token is delivered (the detokenizer skips special tokens) so the client's token count
        matches the model's. EOS is ignored with ``ignore_eos``; no stop id counts before
        ``min_tokens``.
        """
        keep, reason = self.termination.scan(self.num_output_tokens, token_ids)
        kept = token_ids[:keep]
        self.undelivered.extend(kept)
        self.output_token_ids.extend(kept)
        self.undelivered_logprobs.extend(logprobs[:keep])
        self.num_output_tokens += keep
        if reason is not None:
            self.status = FINISH_STATUSES[reason]

    def ready_to_deliver(self, stream_interval: int) -> bool:
        """The first token goes at once, then every ``stream_interval``, and the finish."""
        if self.status.is_finished:
            return True
        if not self.undelivered:
            return False
        return self.num_delivered == 0 or len(self.undelivered) >= stream_interval

    def next_chunk_size(self, stream_interval: int) -> int:
        """Tokens the next output takes: the first token alone, then ``stream_interval`` of
        them, and whatever is left with the finish. With an interval of 1, every token ready
        (those of one step, or of a plan that held them) goes in one output: they were
        sampled together, and more outputs would only cost more work per token."""
        if self.status.is_finished or (stream_interval == 1 and self.num_delivered):
            return len(self.undelivered)
        return 1 if self.num_delivered == 0 else stream_interval

    def take_undelivered(self, count: int | None = None) -> tuple[tuple[int, ...], tuple[TokenLogprob, ...]]:
        """The first ``count`` undelivered tokens (None: all) and their logprobs, now delivered."""
        count = len(self.undelivered) if count is None else count
        taken = tuple(self.undelivered[:count]), tuple(self.undelivered_logprobs[:count])
        self.num_delivered += len(taken[0])
        del self.undelivered[:count]
        del self.undelivered_logprobs[:count]
        return taken
