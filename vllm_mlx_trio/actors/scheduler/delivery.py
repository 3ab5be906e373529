"""How the scheduler hands outputs to clients: never awaiting one, and timing each request.

Every request's outbox is owned by the scheduler while the request is inside; this module is
the one place that sends to it and closes it, so it also knows which request ids the scheduler
holds (from admission until the outbox closes). A client that leaves is noticed two ways, never
by looking at the outbox between sends: a send that finds it gone tells the caller, which takes
the request out of the batch; and a stream closed before its end says so (``Departed``), which
matters for a request that gets nothing to send for a while (queued, prefilling, coalescing).
"""

from __future__ import annotations

import collections

import trio

from ...core.request import Request, RequestStatus
from ...errors import VllmMlxTrioError
from ...messages import RequestFailed, RequestId, RequestOutput
from ...metrics import EngineMetrics


class Delivery:
    """Outputs, failures and per-request timings; counts finished and aborted requests.

    Delivery never blocks: a full outbox means the tokens stay in ``Request.undelivered`` and
    are coalesced into the next send; one slot of every outbox is kept free for the final
    output. Tokens go ``stream_interval`` per output: they wait until that many are ready (the
    first token and the finish go at once), and more than that go as several outputs while the
    outbox has room.
    """

    def __init__(self, *, stream_interval: int, metrics: EngineMetrics | None):
        self._stream_interval = stream_interval
        self._metrics = metrics
        self.num_finished = 0
        self.num_aborted = 0
        #: Request ids whose outbox is open here, counted (a caller may reuse an id).
        self._held: collections.Counter[RequestId] = collections.Counter()
        #: Held requests whose client has said it left, not yet taken out.
        self._departed: set[RequestId] = set()

    def hold(self, request: Request) -> None:
        """The request is the scheduler's from now on (admitted); its outbox is open."""
        self._held[request.request_id] += 1

    def holds(self, request_id: str) -> bool:
        """Whether a request with this id is inside the scheduler (queued or running)."""
        return request_id in self._held

    def client_left(self, request_id: RequestId) -> None:
        """Its client closed the stream early: noted, if the request is still held, for
        :meth:`take_departed`."""
        if request_id in self._held:
            self._departed.add(request_id)

    def has_departed(self, request: Request) -> bool:
        return request.request_id in self._departed

    def take_departed(self) -> list[RequestId]:
        """The held requests whose client left since the last call."""
        departed = list(self._departed)
        self._departed.clear()
        return departed

    def deliver(self, request: Request) -> bool:
        """Hand undelivered tokens to the client without waiting, ``stream_interval`` of them per
        output (the first token alone, whatever is left with the finish) while the outbox has
        room. False: the client is gone (the caller aborts the request)."""
        interval = request.params.stream_interval or self._stream_interval
        while request.ready_to_deliver(interval):
            finished = request.status.is_finished
            stats = request.outbox.statistics()
            room = stats.max_buffer_size - 1 - stats.current_buffer_used  # one slot kept for the finish
            if not finished and room <= 0:
                return True  # keep coalescing until the client reads
            # The last free slot takes everything ready: a client slower than the model catches up.
            count = request.next_chunk_size(interval) if room > 1 else None
            token_ids, logprobs = request.take_undelivered(count)
            output = RequestOutput(
                token_ids=token_ids,
                finish_reason=request.finish_reason,
                num_cached_tokens=request.num_cached_tokens,
                logprobs=logprobs,
            )
            try:
                request.outbox.send_nowait(output)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
            if finished:
                self.num_finished += 1
                self.close(request)
                return True
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
        self.close(request)

    def finish_aborted(self, request: Request) -> None:
        """The client left: no output, the outbox closes."""
        self.time_end(request)
        request.status = RequestStatus.FINISHED_ABORTED
        self.num_aborted += 1
        self.close(request)

    def close(self, request: Request) -> None:
        """Close the request's outbox (without a final output if none was sent): it has left
        the scheduler."""
        request.outbox.close()
        rid = request.request_id
        if rid not in self._held:
            return  # closed already
        self._held[rid] -= 1
        if not self._held[rid]:
            del self._held[rid]
            self._departed.discard(rid)
