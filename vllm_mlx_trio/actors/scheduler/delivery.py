"""How the scheduler hands outputs to clients: never awaiting one, and timing each request.

Every request's outbox is owned by the scheduler while the request is inside; this module is
the one place that sends to it and closes it. A send that finds the client gone tells the
caller, which takes the request out of the batch.
"""

from __future__ import annotations

import trio

from ...core.request import Request, RequestStatus
from ...errors import VllmMlxTrioError
from ...messages import RequestFailed, RequestOutput
from ...metrics import EngineMetrics


class Delivery:
    """Outputs, failures and per-request timings; counts finished and aborted requests.

    Delivery never blocks: a full outbox means the tokens stay in ``Request.undelivered`` and
    are coalesced into the next send; one slot of every outbox is kept free for the final
    output. Tokens also wait until ``stream_interval`` of them are ready (the first token and
    the finish go at once).
    """

    def __init__(self, *, stream_interval: int, metrics: EngineMetrics | None):
        self._stream_interval = stream_interval
        self._metrics = metrics
        self.num_finished = 0
        self.num_aborted = 0

    def deliver(self, request: Request) -> bool:
        """Hand undelivered tokens to the client without waiting. False: the client is gone
        (the caller aborts the request)."""
        finished = request.status.is_finished
        if not request.ready_to_deliver(request.params.stream_interval or self._stream_interval):
            return True
        outbox = request.outbox
        stats = outbox.statistics()
        if not finished and stats.current_buffer_used >= stats.max_buffer_size - 1:
            return True  # keep coalescing; the last slot is reserved for the final output
        token_ids, logprobs = request.take_undelivered()
        output = RequestOutput(
            token_ids=token_ids,
            finish_reason=request.finish_reason,
            num_cached_tokens=request.num_cached_tokens,
            logprobs=logprobs,
        )
        try:
            outbox.send_nowait(output)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        if finished:
            self.num_finished += 1
            outbox.close()
        return True

    def time_request(self, request: Request) -> None:
        """Prefill time at a request's first token, decode time when it leaves the batch."""
        now = trio.current_time()
        if request.first_token_time is None and request.num_output_tokens:
            request.first_token_time = now
            if self._metrics is not None and request.scheduled_time is not None:
                self._metrics.observe(
                    "vllm:request_prefill_time_seconds", now - request.scheduled_time, endpoint=request.endpoint
                )
        if request.status.is_finished:
            self.time_end(request)

    def time_end(self, request: Request) -> None:
        if self._metrics is not None and request.first_token_time is not None:
            elapsed = trio.current_time() - request.first_token_time
            self._metrics.observe("vllm:request_decode_time_seconds", elapsed, endpoint=request.endpoint)

    def fail(self, request: Request, error: VllmMlxTrioError) -> None:
        """The request's last output is ``error`` (if its client is still there to read it)."""
        try:
            request.outbox.send_nowait(RequestFailed(error=error))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client is gone: there is nobody left to tell
        request.outbox.close()

    def finish_aborted(self, request: Request) -> None:
        """The client left: no output, the outbox closes."""
        self.time_end(request)
        request.status = RequestStatus.FINISHED_ABORTED
        self.num_aborted += 1
        request.outbox.close()
