"""Scheduling policy: who waits, who runs, what the next step does. Pure: no Trio, no MLX.

The SchedulerActor owns one :class:`Scheduler` and does all the I/O around it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from ..messages import BlockId, BlockStore, NewSequence, RequestId, StepPlan, StepResult
from .request import Request, RequestStatus


class Scheduler:
    """First come, first served, with at most ``max_running`` sequences in the model.

    Simple mode is ``max_running == 1``; batched mode is ``engine.max_num_seqs``. Finished and aborted requests leave ``running`` at
    once and are named in the next plan's ``finished_ids`` so the executor drops them before
    it computes anything else.
    """

    def __init__(self, *, max_running: int):
        assert max_running >= 1
        self.max_running = max_running
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[RequestId, Request] = {}
        self._starting: list[NewSequence] = []
        self._to_drop: list[RequestId] = []
        self._store_blocks: list[BlockStore] = []
        self._released_ready_ids: list[int] = []
        self._drop_blocks: list[BlockId] = []
        self._next_step_id = 0

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(
            self.waiting or self.running or self._to_drop or self._released_ready_ids or self._drop_blocks
        )

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def pop_startable(self) -> Iterator[Request]:
        """Yield waiting requests, oldest first, while a running slot is free.

        The caller either :meth:`start`\\s each one or drops it (client gone).
        """
        while self.waiting and len(self.running) < self.max_running:  # running includes starting
            yield self.waiting.popleft()

    def start(self, request: Request, *, num_cached_tokens: int, block_ids: tuple = ()) -> None:
        request.status = RequestStatus.RUNNING
        request.num_cached_tokens = num_cached_tokens
        self._starting.append(
            NewSequence(
                request_id=request.request_id,
                prompt_token_ids=request.prompt_token_ids,
                params=request.params,
                num_cached_tokens=num_cached_tokens,
                cached_block_ids=block_ids,
            )
        )
        self.running[request.request_id] = request

    def abort(self, request_id: RequestId, status: RequestStatus) -> Request | None:
        """Take a request out of the batch (or the queue). Unknown or finished: a no-op."""
        request = self.running.pop(request_id, None)
        if request is not None:
            self._to_drop.append(request_id)
            self._starting = [s for s in self._starting if s.request_id != request_id]
        else:
            request = next((r for r in self.waiting if r.request_id == request_id), None)
            if request is None:
                return None
            self.waiting.remove(request)
        request.status = status
        return request

    def queue_block_ops(
        self,
        *,
        store: tuple[BlockStore, ...] = (),
        released_ready_ids: tuple[int, ...] = (),
        drop: tuple[BlockId, ...] = (),
    ) -> None:
        """Prefix-store work for the next plan: keep these copies, free the rest, drop these."""
        self._store_blocks.extend(store)
        self._released_ready_ids.extend(released_ready_ids)
        self._drop_blocks.extend(drop)

    def pending_drops(self) -> tuple[RequestId, ...]:
        """Requests that left the batch since the last plan (the next plan drops them)."""
        return tuple(self._to_drop)

    def build_plan(self) -> StepPlan | None:
        """The next step, or None when there is nothing for the model to do."""
        new_ids = {s.request_id for s in self._starting}
        decode_ids = tuple(rid for rid in self.running if rid not in new_ids)
        plan = StepPlan(
            step_id=self._next_step_id,
            new_seqs=tuple(self._starting),
            decode_ids=decode_ids,
            finished_ids=tuple(self._to_drop),
            store_blocks=tuple(self._store_blocks),
            released_ready_ids=tuple(self._released_ready_ids),
            drop_blocks=tuple(self._drop_blocks),
        )
        if plan.is_empty:
            return None
        self._next_step_id += 1
        for pending in (self._starting, self._to_drop, self._store_blocks, self._released_ready_ids, self._drop_blocks):
            pending.clear()
        return plan

    def apply(self, result: StepResult) -> list[Request]:
        """Record a step's tokens; return every request that got output (finished or not).

        Requests that finished leave ``running`` and are dropped by the next plan.
        ``result.failed`` is the caller's to handle (it carries the error text).
        """
        touched = []
        logprobs = dict(result.logprobs)
        for request_id, token_ids in result.sampled:
            request = self.running.get(request_id)
            if request is None:  # aborted or finished while the step ran: tokens dropped
                continue
            request.append_tokens(token_ids, logprobs.get(request_id, ()))
            touched.append(request)
            if request.status.is_finished:
                self.abort(request_id, request.status)
        return touched
