"""SchedulerActor: owns the waiting queue and the running set, drives the executor step by
step, and fans each step's tokens out to the requests' outboxes without ever awaiting one."""

from __future__ import annotations

import collections
import contextlib

import trio

from ...core.plan_join import is_placeholder
from ...core.request import Request, RequestStatus
from ...errors import EngineStalledError, ExecutorCrashedError
from ...health import EngineFailed, EngineHealth
from ...messages import (
    Admit,
    BlockStore,
    CacheCommand,
    CacheReply,
    ClearPrefixCache,
    ControlCommand,
    Departed,
    FailAll,
    KVReady,
    PlanMessage,
    RequestWaiting,
    StepPlan,
    StepResult,
)
from ...metrics import EngineMetrics
from ..prefix.cache_client import CacheClient
from .control_inbox import ControlInbox
from .delivery import Delivery
from .settings import SchedulerSettings
from .stats import SchedulerStatistics, scheduler_statistics
from .step_outcome import abort_departed, apply_result, fail_held, preempt_for_growth, record_preemptions
from .watchdog import StepWatchdog


class SchedulerActor:
    """Decides who runs and delivers what they produce.

    Inputs: ``admit_recv`` (from admission), ``control_recv`` (operator commands from the
    facade, acted on between steps), ``depart_recv`` (streams closed before their end, from the
    facade), ``result_recv`` (from the executor) and ``match_recv`` (from the cache manager).
    Outputs: ``plan_send``, ``cache_send`` and each request's own outbox. At most
    ``plans_in_flight`` plans are outstanding on the executor edge (1 is lock-step; 2 lets the
    executor start the next step while this actor handles the last result), and the result
    channel holds that many, so neither side can fill the other's buffer. A plan built while
    an earlier one is in flight may still name a request that the earlier step finishes; that
    step's token for it is dropped.

    Join plans: while it waits for a result and no prompt is being computed, a request that
    arrives is looked up at once and sent in a plan beyond ``plans_in_flight``, which the
    executor runs in the step of the plan queued behind the running one (core/plan_join.py):
    an exact repeat starts a step earlier. While a prompt is computed, arrivals wait for its
    result, so a burst of one prompt reuses its blocks instead of computing it again. Each
    join plan starts a request, so there are at most ``max_running`` of them.

    Delivery never blocks (actors/scheduler/delivery.py): tokens a full outbox cannot take are
    coalesced into the next send. A client gone (a send to its closed outbox fails, or its
    ``Departed`` arrives) is aborted before the next step. A step that stalls is caught by the
    watchdog (actors/scheduler/watchdog.py).
    """

    def __init__(
        self,
        *,
        admit_recv: trio.MemoryReceiveChannel[Admit],
        control_recv: trio.MemoryReceiveChannel[ControlCommand],
        depart_recv: trio.MemoryReceiveChannel[Departed],
        plan_send: trio.MemorySendChannel[PlanMessage],
        result_recv: trio.MemoryReceiveChannel[StepResult],
        cache_send: trio.MemorySendChannel[CacheCommand],
        match_recv: trio.MemoryReceiveChannel[CacheReply],
        settings: SchedulerSettings,
        metrics: EngineMetrics | None = None,
        health: EngineHealth | None = None,
    ):
        self._admit_recv = admit_recv
        self._control_recv = control_recv
        self._control = ControlInbox(control_recv, wake=self._wake_loop)
        self._depart_recv = depart_recv
        self._plan_send = plan_send
        self._result_recv = result_recv
        self._cache_send = cache_send
        self._match_recv = match_recv
        self._cache = CacheClient(cache_send, match_recv)
        self._settings = settings
        self._scheduler = settings.new_scheduler()
        self._in_flight: collections.deque[StepPlan] = collections.deque()
        #: Set while waiting for a result: an admission cancels it so the newcomer can join.
        self._result_wait: trio.CancelScope | None = None
        self._delivery = Delivery(stream_interval=settings.stream_interval, metrics=metrics)
        self._metrics = metrics
        self._health = health or EngineHealth()
        stall_s = settings.stall_timeout_s
        self._watchdog = (
            None if stall_s is None else StepWatchdog(stall_s, busy=self._stepping_now, on_stall=self._declare_stalled)
        )
        self._memory = (0, 0, 0)
        self._admissions_open = True
        #: Set when there may be something to do: an admission, a command, admission closing.
        self._wake = trio.Event()
        #: The stepping part of the loop; cancelled when the engine fails.
        self._stepping = trio.CancelScope()
        self._num_steps = 0

    def _stepping_now(self) -> bool:
        """Whether a plan is out on the executor (the watchdog's probe)."""
        return bool(self._in_flight)

    def statistics(self) -> SchedulerStatistics:
        return scheduler_statistics(
            self._scheduler,
            delivery=self._delivery,
            num_steps=self._num_steps,
            admit_queue_depth=self._admit_recv.statistics().current_buffer_used,
            plans_in_flight=len(self._in_flight),
            memory=self._memory,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until admission closes its channel and every request has finished.

        Cancellation (engine shutdown) closes every outstanding outbox without a final
        output; the client reads that as "the engine stopped".
        """
        with (
            self._admit_recv,
            self._control_recv,
            self._depart_recv,
            self._plan_send,
            self._result_recv,
            self._cache_send,
            self._match_recv,
        ):
            try:
                task_status.started()
                await self._loop()
            finally:
                self._close_all_outboxes()
                self._control.refuse_all()  # nobody will act on them now

    async def _loop(self) -> None:
        """Step while there is work; admissions and commands are taken in concurrently, even
        mid-step. An engine failure cancels the stepping (woken by the health's failure, never
        polled); from then on everything admitted fails at once."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_admissions)
            nursery.start_soon(self._control.receive)
            nursery.start_soon(self._receive_departures)
            nursery.start_soon(self._stop_stepping_on_failure)
            if self._watchdog is not None:
                nursery.start_soon(self._watchdog.run)
            with self._stepping:
                await self._step_until_done()
            if not self._health.snapshot().ok:
                await self._refuse_while_failed()
            nursery.cancel_scope.cancel()

    async def _step_until_done(self) -> None:
        while self._admissions_open or self._scheduler.has_work or self._in_flight:
            await self._act_on_command()
            if not (self._scheduler.has_work or self._in_flight):
                await self._wait_for_work()
                continue
            await self._start_waiting()
            await self._send_plans()
            if self._in_flight:
                await self._finish_step()

    def _wake_loop(self) -> None:
        self._wake.set()

    async def _wait_for_work(self) -> None:
        await self._wake.wait()
        self._wake = trio.Event()

    async def _stop_stepping_on_failure(self) -> None:
        await self._health.wait_failed()
        self._stepping.cancel()

    async def _receive_departures(self) -> None:
        """Note each client that left; the loop takes their requests out between two steps."""
        async for departed in self._depart_recv:
            self._delivery.client_left(departed.request_id)

    async def _receive_admissions(self) -> None:
        """Queue every admission as it arrives (the waiting count is always current)."""
        async for admit in self._admit_recv:
            request = Request(admit, self._settings.eos_token_ids)
            self._delivery.hold(request)
            self._scheduler.add(request)
            self._wake_loop()
            if self._in_flight:  # it can start at the next plan boundary: end the run-ahead
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    self._plan_send.send_nowait(RequestWaiting())
            if self._result_wait is not None and self._room_to_join():
                self._result_wait.cancel()  # it may start now, in a join plan
        self._admissions_open = False
        self._wake_loop()

    async def _send_plans(self) -> None:
        """Top the executor up to ``plans_in_flight`` outstanding plans."""
        while len(self._in_flight) < self._settings.plans_in_flight and await self._send_plan():
            pass

    async def _send_plan(self, *, join_previous: bool = False) -> bool:
        """Build and send the next plan (``join_previous``: a join plan); False when there is
        none (or the executor is gone)."""
        plan = self._scheduler.build_plan(join_previous=join_previous)
        if plan is None:
            return False
        try:
            await self._plan_send.send(plan)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._executor_gone()  # the executor stopped, or the watchdog gave up on it
            return False
        self._in_flight.append(plan)
        self._progress()
        return True

    def _declare_stalled(self) -> None:
        """The watchdog saw no progress for ``stall_timeout_s``: the failure stops the stepping,
        which then fails every request, and closing our ends of the executor edge lets the
        executor go."""
        if self._health.snapshot().ok:
            assert self._watchdog is not None
            stalled = EngineStalledError(f"a model step took longer than {self._watchdog.timeout_s} s")
            self._health.report(EngineFailed(error=stalled))
            self._plan_send.close()
            self._result_recv.close()

    def _progress(self) -> None:
        if self._watchdog is not None:
            self._watchdog.progress()

    def _executor_gone(self) -> None:
        """The executor stopped: fail every request with its cause; the failure (recorded in
        ``health``) then stops the stepping."""
        self._health.report(EngineFailed(error=ExecutorCrashedError("the executor stopped in the middle of a step")))
        self._fail_everything()

    def _fail_everything(self) -> None:
        """Fail every request held with the engine's failure (the first one reported)."""
        error = self._health.snapshot().error
        assert error is not None
        for request in [*self._scheduler.running.values(), *self._scheduler.waiting]:
            request.status = RequestStatus.FINISHED_ERROR
            self._delivery.fail(request, error)
        self._scheduler = self._settings.new_scheduler()
        self._in_flight.clear()

    async def _refuse_while_failed(self) -> None:
        """After a failure: fail whatever is held or admitted, and answer no command, until
        admission closes."""
        while True:
            self._fail_everything()
            with self._control.next_command():
                pass  # a cache clear's caller hears that the engine stopped
            if not self._admissions_open:
                return
            await self._wait_for_work()

    async def _start_waiting(self) -> None:
        """Start the waiting requests that fit (a prefix lookup each), preempting running ones
        of a lower priority when the batch is full; one whose client has left is dropped instead."""
        try:
            await self._start_fitting()
        finally:
            preempted = self._scheduler.take_priority_preemptions()
            record_preemptions(preempted, "for a request of a higher priority", self._metrics)

    async def _start_fitting(self) -> None:
        for request in self._scheduler.pop_startable():
            if self._delivery.has_departed(request):
                self._delivery.finish_aborted(request)
                continue
            try:
                await self._release_leases()  # a request preempted for this one may start again below
                match = await self._cache.lookup(request)
            except BaseException:  # cancelled (the engine failed or stops): not swallowed
                self._scheduler.waiting.appendleft(request)  # back where whoever cleans up finds it
                raise
            self._scheduler.start(
                request,
                num_cached_tokens=match.num_cached_tokens,
                block_ids=match.block_ids,
                disk_blocks=match.disk_blocks,
            )
            request.scheduled_time = trio.current_time()
            if self._metrics is not None:
                self._metrics.observe(
                    "vllm:request_queue_time_seconds",
                    request.scheduled_time - request.arrival_time,
                    endpoint=request.endpoint,
                )
                self._metrics.on_prefix_lookup(len(request.prompt_token_ids), match.num_cached_tokens)

    async def _next_result(self) -> StepResult | None:
        """The oldest plan's result (None: the executor stopped). Meanwhile requests started
        and not yet sent, and those admitted while none is computing its prompt, are sent in
        join plans while there is room for one."""
        while True:
            if self._scheduler.has_starting and self._room_to_join():
                await self._send_plan(join_previous=True)
            scope = trio.CancelScope()
            # Else an admission waits for the result. Whether a join plan has room is asked when one
            # comes (nothing it depends on changes while this task waits), not at every result.
            self._result_wait = None if self._scheduler.computing_prompt else scope
            try:
                with scope:
                    return await self._result_recv.receive()
            except (trio.EndOfChannel, trio.ClosedResourceError):
                return None
            finally:
                self._result_wait = None
            await self._start_waiting()

    def _room_to_join(self) -> bool:
        """Whether a join plan may be sent now: a plan is queued behind the running one to join,
        below the outstanding bound, and the KV budget has room for the batch to run ahead."""
        outstanding, settings = len(self._in_flight), self._settings
        return (
            settings.plans_in_flight >= 2
            and outstanding >= 1
            and outstanding < settings.max_outstanding
            and self._scheduler.fits_ahead((outstanding + 1 - settings.plans_in_flight) * settings.max_tokens_per_step)
        )

    async def _finish_step(self) -> None:
        """Wait for the oldest plan's result and hand its tokens out; the tokens of its steps
        that end while it runs on as they come, a placeholder's (its plan ran in the next plan's
        step) and then that step's, so nobody is looked up between them."""
        while await self._finish_one() is False:
            pass

    async def _finish_one(self) -> bool | None:
        """Handle one result: False for a step of a plan that runs on or a placeholder, None
        when the executor is gone."""
        result = await self._next_result()
        if result is None:
            self._executor_gone()  # the executor stopped, or the watchdog gave up on it
            return None
        self._progress()
        if result.plan_continues:  # a step of the running plan: its tokens go out now
            await self._commit(result.kv_ready)
            apply_result(result, scheduler=self._scheduler, delivery=self._delivery, metrics=self._metrics)
            # Before the next join plan takes the finished ones' ids: their blocks are released now.
            await self._release_finished()
            return False
        plan = self._in_flight.popleft()
        assert result.step_id == plan.step_id, "results arrive in plan order"
        model_step = not is_placeholder(result)  # else the plan ran in the next plan's step
        self._num_steps += model_step
        self._memory = result.memory
        await self._commit(result.kv_ready)
        apply_result(result, scheduler=self._scheduler, delivery=self._delivery, metrics=self._metrics)
        preempt_for_growth(self._scheduler, self._metrics)
        await self._release_finished()
        return model_step

    async def _commit(self, kv_ready: tuple[KVReady, ...]) -> None:
        """One round trip per computed prompt (or finished sequence): which copies to keep."""
        for ready in kv_ready:
            request = self._scheduler.running.get(ready.request_id)
            if request is None:  # aborted meanwhile: its blocks are released, keep no copies
                self._scheduler.queue_block_ops(released_ready_ids=(ready.ready_id,))
                continue
            stored = await self._cache.commit(ready, request.cache_keys, request.media_keys)
            self._scheduler.queue_block_ops(
                store=tuple(BlockStore(ready_id=ready.ready_id, block_index=i, block_id=b) for i, b in stored.store),
                released_ready_ids=(ready.ready_id,),
                drop=stored.evicted,
                spill=stored.spilled,
            )

    async def _act_on_command(self) -> None:
        """Between two steps: act on the operator's waiting command, if any."""
        with self._control.next_command() as command:
            match command:
                case FailAll(error=error):
                    fail_held(error, scheduler=self._scheduler, delivery=self._delivery)
                case ClearPrefixCache(reply=reply):
                    evicted = await self._cache.clear()
                    self._scheduler.queue_block_ops(drop=evicted, clear_disk=True)
                    with contextlib.suppress(trio.BrokenResourceError):  # the caller left
                        reply.send_nowait(len(evicted))

    def holds(self, request_id: str) -> bool:
        """Whether a request with this id is queued or running (a set lookup: no snapshot, no scan)."""
        return self._delivery.holds(request_id)

    async def _release_finished(self) -> None:
        abort_departed(scheduler=self._scheduler, delivery=self._delivery)
        await self._release_leases()

    async def _release_leases(self) -> None:
        """End the prefix-cache leases of the requests that left the batch since the last call."""
        dropped = self._scheduler.take_lease_releases()
        if dropped:
            released = await self._cache.release(dropped)
            self._scheduler.queue_block_ops(drop=released.evicted, spill=released.spilled)

    def _close_all_outboxes(self) -> None:
        for request in [*self._scheduler.waiting, *self._scheduler.running.values()]:
            self._delivery.close(request)
