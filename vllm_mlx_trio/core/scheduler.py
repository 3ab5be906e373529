"""Scheduling policy: who waits, who runs, what the next step does. Pure: no Trio, no MLX.

The SchedulerActor owns one :class:`Scheduler` and does all the I/O around it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from .plan import BlockId, BlockStore, NewSequence, RequestId, StepPlan, StepResult
from .request import Request, RequestStatus
from .shared_prefix import SharedPrefixCount
from .shared_prefix import kv_tokens as shared_kv_tokens

#: Room to grow, in tokens per row, a batch must have left before a new sequence joins it,
#: so a sequence that has just been prefilled is not preempted a few steps later.
ADMIT_HEADROOM_TOKENS = 16


class Scheduler:
    """First come, first served, with at most ``max_running`` sequences in the model.

    Simple mode is ``max_running == 1``; batched mode is ``engine.max_num_seqs``. Finished
    and aborted requests leave ``running`` at once and are named in the next plan's
    ``finished_ids`` so the executor drops them before it computes anything else.

    With ``kv_budget_tokens`` the running set's KV must fit the budget. The batch's KV is a
    rectangle (mlx-lm pads every row to the longest), so it costs rows x longest row (with
    ``shared_prefix``, rows sharing a cached prefix in the batch: that prefix once plus rows x
    longest suffix, core/shared_prefix.py). A
    waiting request joins only if the batch with it still has ``ADMIT_HEADROOM_TOKENS`` per
    row to grow; when growth leaves less than ``lookahead_tokens`` per row, the newest
    running request is preempted: it goes back to the head of the queue and is later
    recomputed from its prompt and the tokens it already produced. The oldest request always
    runs, and admission refuses a request that could not run alone, so all of them finish.

    With ``max_num_batched_tokens`` (vLLM's name) each step has a token budget: one per
    decoding row, plus, per prompt being prefilled, the chunk the runner gives it each step
    (``min(prompt tokens left, prefill_chunk_tokens)``, or ``prefill_chunk_decoding_tokens``
    while some row decodes, as the runner does). A waiting request starts only if its
    chunk still fits beside them, so the first arrivals are prefilled alone and get their
    first token early instead of all waiting for the whole group; one prompt is always let in
    when none is being prefilled, so a long one cannot wait for ever. A request counts as
    prefilling from its start until its first token. Each new sequence names the running
    requests whose first token came before it arrived (``NewSequence.protects``): the runner
    keeps their pace while it prefills the newcomer, and prefills a burst back to back.
    """

    def __init__(
        self,
        *,
        max_running: int,
        kv_budget_tokens: int | None = None,
        lookahead_tokens: int = 1,
        max_num_batched_tokens: int | None = None,
        prefill_chunk_tokens: int | None = None,
        prefill_chunk_decoding_tokens: int | None = None,
        shared_prefix: SharedPrefixCount | None = None,
    ):
        assert max_running >= 1
        self.max_running = max_running
        self.kv_budget_tokens = kv_budget_tokens
        #: Tokens a row may have computed that this scheduler has not seen yet (plans in
        #: flight), plus those the next step adds: tokens, not steps (a step may give several).
        self.lookahead_tokens = lookahead_tokens
        self.num_preemptions = 0
        #: Requests preempted by a waiting request of a higher priority, not yet taken.
        self.priority_preempted: list[Request] = []
        self.max_num_batched_tokens = max_num_batched_tokens
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.prefill_chunk_decoding_tokens = prefill_chunk_decoding_tokens
        #: Rows sharing a cached prefix hold it once (the batched runner's shared prefix), else None.
        self.shared_prefix = shared_prefix
        #: Started requests with no token yet: the prompt tokens each has to prefill.
        self._prefilling: dict[RequestId, int] = {}
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[RequestId, Request] = {}
        self._starting: list[NewSequence] = []
        self._to_drop: list[RequestId] = []
        #: Requests that left the batch whose prefix-cache leases are not yet released (taken once,
        #: apart from ``_to_drop``, which the next plan takes, a join plan too).
        self._to_release: list[RequestId] = []
        self._store_blocks: list[BlockStore] = []
        self._released_ready_ids: list[int] = []
        self._drop_blocks: list[BlockId] = []
        self._spill_blocks: list[tuple[BlockId, bytes]] = []
        self._clear_disk = False
        self._next_step_id = 0

    @property
    def has_starting(self) -> bool:
        """Whether started requests wait for the next plan."""
        return bool(self._starting)

    @property
    def computing_prompt(self) -> bool:
        """Whether a started request has more than its last prompt token to compute."""
        return any(left > 1 for left in self._prefilling.values())

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(
            self.waiting
            or self.running
            or self._to_drop
            or self._released_ready_ids
            or self._drop_blocks
            or self._clear_disk
        )

    def add(self, request: Request) -> None:
        """Queue behind every waiting request of the same or a lower ``priority`` value."""
        priority = request.params.priority
        if not self.waiting or self.waiting[-1].params.priority <= priority:
            self.waiting.append(request)  # the common case: no priorities in use
            return
        index = next(i for i, r in enumerate(self.waiting) if r.params.priority > priority)
        self.waiting.insert(index, request)

    def pop_startable(self) -> Iterator[Request]:
        """Yield waiting requests, oldest first, while a running slot is free.

        A head that finds the batch full (every slot taken, or no KV room left) preempts the
        running request of the lowest priority below its own (:meth:`_priority_victim`) until
        it fits, as vLLM's priority scheduling does; the victims are recomputed later, like
        the requests preempted for growth, and are listed in ``priority_preempted``.
        The caller either :meth:`start`\\s each one or drops it (client gone).
        """
        while self.waiting:
            head = self.waiting[0]
            full = len(self.running) >= self.max_running  # running includes starting
            if full or (self.running and not self._fits(head, ADMIT_HEADROOM_TOKENS)):
                victim = self._priority_victim(head)
                if victim is None:
                    return  # the head waits for room; nobody overtakes it
                self.priority_preempted.append(self._preempt(victim))
                continue
            if not self._prefill_fits(head):
                return  # the step's token budget is spent; the head waits for the next
            yield self.waiting.popleft()

    def _priority_victim(self, head: Request) -> Request | None:
        """The running request ``head`` preempts: of those with a lower priority (a larger
        ``priority`` value), the lowest, the latest started among equals. None when none is
        lower, or when ``head`` would not fit even without all of them (nobody is preempted
        for nothing)."""
        priority = head.params.priority
        lower = [r for r in self.running.values() if r.params.priority > priority]
        if not lower:
            return None
        kept = [r for r in self.running.values() if r.params.priority <= priority]
        if len(kept) >= self.max_running:
            return None
        if kept and self.kv_budget_tokens is not None:
            if self._kv_need(kept, ADMIT_HEADROOM_TOKENS, waiting=head) > self.kv_budget_tokens:
                return None
        return max(reversed(lower), key=lambda r: r.params.priority)

    def take_priority_preemptions(self) -> list[Request]:
        """The requests preempted for a higher priority since the last call."""
        taken, self.priority_preempted = self.priority_preempted, []
        return taken

    def _chunk(self, num_prompt_tokens: int) -> int:
        """Prompt tokens the runner gives a prompt this long in one step (the smaller chunk
        while some row decodes)."""
        chunk = self.prefill_chunk_tokens
        if self._num_decoding and self.prefill_chunk_decoding_tokens is not None:
            chunk = min(chunk or self.prefill_chunk_decoding_tokens, self.prefill_chunk_decoding_tokens)
        return max(1, min(num_prompt_tokens, chunk) if chunk else num_prompt_tokens)

    @property
    def _num_decoding(self) -> int:
        return len(self.running) - len(self._prefilling)

    @property
    def step_tokens(self) -> int:
        """Tokens the next step computes: one per decoding row, a chunk per prefilling one."""
        return self._num_decoding + sum(self._chunk(left) for left in self._prefilling.values())

    def _prefill_fits(self, request: Request) -> bool:
        """Whether ``request``'s first chunk fits the step's budget (its whole prompt counts:
        the prefix cache's share is not known before the lookup)."""
        budget = self.max_num_batched_tokens
        if budget is None or not self._prefilling:
            return True
        return self.step_tokens + self._chunk(request.num_tokens) <= budget

    @property
    def kv_tokens_held(self) -> int:
        """KV token slots the running batch holds now (rows x longest row; with a shared prefix, that prefix
        once plus rows x longest suffix)."""
        return self._kv_need(list(self.running.values()), 0)

    @property
    def kv_tokens_unshared(self) -> int:
        """KV token slots the running batch would hold with a prefix copy per row (rows x longest row)."""
        lengths = [r.num_tokens for r in self.running.values()]
        return len(lengths) * max(lengths) if lengths else 0

    def _kv_need(self, rows: list[Request], headroom: int, *, waiting: Request | None = None) -> int:
        """KV tokens a batch of these rows (and ``waiting``) takes once each has grown by ``headroom``."""
        lengths = [r.num_tokens for r in rows]
        if self.shared_prefix is None:
            lengths += [waiting.num_tokens] if waiting is not None else []
            return len(lengths) * (max(lengths) + headroom) if lengths else 0
        shared = [self.shared_prefix.shared(r.request_id) for r in rows]
        if waiting is not None:
            lengths.append(waiting.num_tokens)
            shared.append(self.shared_prefix.estimate(waiting.all_token_ids))
        return shared_kv_tokens(lengths, shared, headroom)

    def _fits(self, request: Request, headroom: int) -> bool:
        if self.kv_budget_tokens is None:
            return True
        return self._kv_need(list(self.running.values()), headroom, waiting=request) <= self.kv_budget_tokens

    def fits_ahead(self, tokens: int) -> bool:
        """Whether the running batch stays in the KV budget if it grows ``tokens`` per row
        beyond ``lookahead_tokens`` (plans outstanding beyond those the lookahead counts)."""
        if self.kv_budget_tokens is None or tokens <= 0:
            return True
        return self._kv_need(list(self.running.values()), self.lookahead_tokens + tokens) <= self.kv_budget_tokens

    def preempt_for_growth(self) -> list[Request]:
        """Preempt running requests until the next steps fit the KV budget: the lowest
        priority first, the newest among equals."""
        preempted: list[Request] = []
        budget = self.kv_budget_tokens
        while budget is not None and len(self.running) > 1:
            if self._kv_need(list(self.running.values()), self.lookahead_tokens) <= budget:
                break
            victim = max(reversed(self.running.values()), key=lambda r: r.params.priority)
            preempted.append(self._preempt(victim))
        return preempted

    def _preempt(self, request: Request) -> Request:
        """Back to the queue, ahead of every waiting request of its priority (it arrived
        before them) and behind the higher ones; the executor drops its row in the next plan."""
        self.abort(request.request_id, RequestStatus.WAITING)
        request.num_preemptions += 1
        request.first_valid_step = self._next_step_id
        priority = request.params.priority
        index = next((i for i, r in enumerate(self.waiting) if r.params.priority >= priority), len(self.waiting))
        self.waiting.insert(index, request)
        self.num_preemptions += 1
        return request

    def start(
        self, request: Request, *, num_cached_tokens: int, block_ids: tuple = (), disk_blocks: tuple = ()
    ) -> None:
        """Put a request in the next plan; a preempted one restarts from prompt + output."""
        request.status = RequestStatus.RUNNING
        if not request.num_preemptions:  # usage reports the first run's cache hit
            request.num_cached_tokens = num_cached_tokens
        self._starting.append(
            NewSequence(
                request_id=request.request_id,
                prompt_token_ids=request.all_token_ids,
                params=request.params,
                num_cached_tokens=num_cached_tokens,
                cached_block_ids=block_ids,
                disk_blocks=disk_blocks,
                num_output_tokens=request.num_output_tokens,
                protects=self._streaming_before(request),
                media=request.media,
            )
        )
        self.running[request.request_id] = request
        if self.shared_prefix is not None:
            self.shared_prefix.start(request.request_id, request.all_token_ids, num_cached_tokens)
        self._prefilling[request.request_id] = request.num_tokens - num_cached_tokens

    def _streaming_before(self, request: Request) -> tuple[RequestId, ...]:
        """The running requests whose first token came before ``request`` arrived."""
        arrived = request.arrival_time
        return tuple(
            rid
            for rid, other in self.running.items()
            if other.first_token_time is not None and other.first_token_time < arrived
        )

    def abort(self, request_id: RequestId, status: RequestStatus) -> Request | None:
        """Take a request out of the batch (or the queue). Unknown or finished: a no-op."""
        request = self.running.pop(request_id, None)
        self._prefilling.pop(request_id, None)
        if request is not None:
            if self.shared_prefix is not None:
                self.shared_prefix.leave(request_id, list(self.running), lambda rid: self.running[rid].all_token_ids)
            self._to_drop.append(request_id)
            self._to_release.append(request_id)
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
        spill: tuple[tuple[BlockId, bytes], ...] = (),
        clear_disk: bool = False,
    ) -> None:
        """Prefix-store work for the next plan: keep these copies, free the rest, drop these
        (writing ``spill`` to the disk tier first), empty the disk tier."""
        self._store_blocks.extend(store)
        self._released_ready_ids.extend(released_ready_ids)
        self._drop_blocks.extend(drop)
        self._spill_blocks.extend(spill)
        self._clear_disk = self._clear_disk or clear_disk

    def pending_drops(self) -> tuple[RequestId, ...]:
        """Requests that left the batch since the last plan (the next plan drops them)."""
        return tuple(self._to_drop)

    def take_lease_releases(self) -> tuple[RequestId, ...]:
        """Requests that left the batch since the last call: their prefix-cache leases end now
        (each once, whether or not a plan has dropped them yet)."""
        taken = tuple(self._to_release)
        self._to_release.clear()
        return taken

    def build_plan(self, *, join_previous: bool = False) -> StepPlan | None:
        """The next step, or None when there is nothing for the model to do. ``join_previous``:
        a join plan (core/plan_join.py)."""
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
            spill_blocks=tuple(self._spill_blocks),
            clear_disk=self._clear_disk,
            join_previous=join_previous,
        )
        if plan.is_empty:
            return None
        self._next_step_id += 1
        pendings = (self._starting, self._to_drop, self._store_blocks, self._released_ready_ids, self._drop_blocks)
        for pending in (*pendings, self._spill_blocks):
            pending.clear()
        self._clear_disk = False
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
            if request is None or result.step_id < request.first_valid_step:
                continue  # aborted, finished or preempted while the step ran: tokens dropped
            self._prefilling.pop(request_id, None)
            request.append_tokens(token_ids, logprobs.get(request_id, ()))
            touched.append(request)
            if request.status.is_finished:
                self.abort(request_id, request.status)
        return touched
