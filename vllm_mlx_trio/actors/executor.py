"""ExecutorActor: the one dedicated thread that runs MLX, bridged to Trio by channels.

The thread lives as long as the actor: it loads the model, creates the MLX stream and runs
every step. Plans reach it through a thread-safe queue; results go back with the Trio token's
``run_sync_soon(result_send.send_nowait, ...)``, fire and forget: it never blocks the
thread, and never finds the channel full because the scheduler keeps at most
the runner's ``plans_in_flight`` plans outstanding and the result channel holds every result
they may give (a plan that runs several steps gives one per step, as each step ends: the
runner's ``publish``).
The runner is built with a ``threading.Event`` that is set while a queued plan starts a
sequence, or the scheduler has said that a request waits for the next plan boundary
(``RequestWaiting``, sent beside the plans): a batch runner then ends its run-ahead
(``starts_waiting``), so a new request waits about one step.
Plans queued back to back run as one step when they can (core/plan_join.py): a request's plan
sent while another waits behind the running step starts it in that step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

import trio

from ..core.plan_join import can_join, joined, placeholder_result
from ..errors import ExecutorCrashedError, VllmMlxTrioError
from ..messages import ModelInfo, PlanMessage, RequestWaiting, StepPlan, StepResult
from ..worker.registry import Runner

#: The stop marker: the thread closes the runner and ends when it takes this from its inbox.
_STOP = object()


class _Inbox:
    """Plans on their way to the thread. A normal stop queues the stop marker behind the
    plans already sent; abandoning (cancelled, or nobody takes results any more) makes the
    thread skip whatever is still queued and stop after its current step."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._abandoned = threading.Event()
        #: Set while a queued plan starts a sequence or a request waits for the next plan
        #: boundary; the runner is built with it (it stops running ahead while it is set).
        self.waiting = threading.Event()
        self._lock = threading.Lock()
        #: Under the lock: queued plans that start sequences, and whether the scheduler holds a
        #: request for the next plan boundary (forgotten when the next plan is taken).
        self._starting = 0
        self._hinted = False
        #: Taken from the queue but not joined to the step before it: the next step's first item.
        self._held: object | None = None

    def put(self, plan: StepPlan) -> None:
        if plan.new_seqs:
            self._change(starting=1)
        self._queue.put(plan)

    def request_waiting(self) -> None:
        """A request waits for the next plan boundary: the plan running now ends its run-ahead."""
        self._change(hinted=True)

    def starts_waiting(self) -> bool:
        """Whether a queued plan starts a sequence, or a request waits for the next plan."""
        return self.waiting.is_set()

    def _change(self, *, starting: int = 0, hinted: bool | None = None) -> None:
        """Count ``starting`` more (or fewer) queued plans that start sequences, set or forget
        the hint, and let ``waiting`` say whether either is left."""
        with self._lock:
            self._starting += starting
            if hinted is not None:
                self._hinted = hinted
            if self._starting or self._hinted:
                self.waiting.set()
            else:
                self.waiting.clear()

    def stop(self) -> None:
        self._queue.put(_STOP)

    def abandon(self) -> None:
        self._abandoned.set()
        self._queue.put(_STOP)

    def next_plans(self) -> list[StepPlan] | None:
        """The next plan to run, with those queued right behind it that can run in the same
        step (blocks for the first); None: stop now."""
        first = self._take(block=True)
        if not isinstance(first, StepPlan) or self._abandoned.is_set():
            return None
        # The plan that ended for it has gone back; from here a queued plan that starts the
        # request (``_starting``) is what ends this one's run-ahead.
        self._change(hinted=False)
        plans = [first]
        while (following := self._take(block=False)) is not None:
            if not isinstance(following, StepPlan) or not can_join(plans, following):
                self._held = following  # the stop marker, or a plan for the next step
                break
            plans.append(following)
        starting = sum(1 for plan in plans if plan.new_seqs)
        if starting:
            self._change(starting=-starting)
        return plans

    def _take(self, *, block: bool) -> object | None:
        """The next item (a plan or the stop marker); None: nothing queued (``block`` False)."""
        if self._held is not None:
            item, self._held = self._held, None
        else:
            try:
                item = self._queue.get(block=block)
            except queue.Empty:
                return None
        return item


class ExecutorActor:
    """Owns the MLX thread. ``started`` reports the loaded model's :class:`ModelInfo`.

    A normal stop (the plan channel closes) lets the current step finish, then the thread
    stops and ``run`` returns. Cancelling the actor (a stalled step, a second signal) returns
    at once and abandons the thread, which stops at its next plan or dies with the process.
    An exception on the thread ends the actor with an
    :class:`ExecutorCrashedError` (or the thread's own typed error), failing the engine.
    """

    def __init__(
        self,
        *,
        plan_recv: trio.MemoryReceiveChannel[PlanMessage],
        result_send: trio.MemorySendChannel[StepResult],
        runner_factory: Callable[[threading.Event], Runner],
    ):
        """``runner_factory`` builds the runner, on the thread, given the event that is set while
        a request waits for the next plan boundary."""
        self._plan_recv = plan_recv
        self._result_send = result_send
        self._runner_factory = runner_factory
        self.thread_name = "mlx-executor"

    async def run(self, *, task_status: trio.TaskStatus[ModelInfo] = trio.TASK_STATUS_IGNORED) -> None:
        inbox = _Inbox()
        with self._plan_recv, self._result_send:
            async with trio.open_nursery() as nursery:
                model_info = await nursery.start(self._run_thread, inbox)
                task_status.started(model_info)
                async for message in self._plan_recv:
                    if isinstance(message, RequestWaiting):
                        inbox.request_waiting()
                    else:
                        inbox.put(message)
                inbox.stop()

    async def _run_thread(self, inbox: _Inbox, *, task_status: trio.TaskStatus[ModelInfo]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_thread_on_cancel, inbox)
            await trio.to_thread.run_sync(
                self._thread_main,
                inbox,
                task_status.started,
                thread_name=self.thread_name,
                # Cancelled means the engine is stopping at once (a second signal) or the
                # step is stalled: leave the thread; it stops after its current step, running
                # no queued plan, or dies with the process. A normal stop arrives as a stop
                # marker instead.
                abandon_on_cancel=True,
            )
            nursery.cancel_scope.cancel()

    def _thread_main(self, inbox: _Inbox, report_started: Callable[[ModelInfo], None]) -> None:
        runner = self._runner_factory(inbox.waiting)
        try:
            model_info = runner.load()
            trio_token = trio.from_thread.run_sync(trio.lowlevel.current_trio_token)
            trio.from_thread.run_sync(report_started, model_info)
            # A plan that runs several steps hands each one's tokens over as it ends.
            runner.publish = lambda result: trio_token.run_sync_soon(self._deliver, result, inbox)
            while (plans := inbox.next_plans()) is not None:
                result = _execute(runner, joined(plans))
                # Fire and forget, one result per plan in order: the thread goes straight on to
                # the next queued plan.
                for plan in plans[:-1]:
                    trio_token.run_sync_soon(self._deliver, placeholder_result(plan, result), inbox)
                trio_token.run_sync_soon(self._deliver, result, inbox)
        finally:
            runner.close()

    def _deliver(self, result: StepResult, inbox: _Inbox) -> None:
        """Hand a result to the scheduler; runs in Trio and must not raise.

        The channel holds as many results as the plans in flight may give (each step of a plan
        that runs several, ``RunnerShape.results_per_plan``), so it is never full.
        Once the scheduler is gone (engine failing or cancelled) the thread is told to stop.
        """
        try:
            self._result_send.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            inbox.abandon()


async def _stop_thread_on_cancel(inbox: _Inbox) -> None:
    """Wait; when cancelled, tell the thread to stop after its current step."""
    try:
        await trio.sleep_forever()
    finally:
        inbox.abandon()


def _execute(runner: Runner, plan: StepPlan) -> StepResult:
    try:
        return runner.execute(plan)
    except VllmMlxTrioError:
        raise
    except Exception as exc:  # boundary: an MLX failure kills the engine, with a clear cause
        raise ExecutorCrashedError(f"step {plan.step_id} failed: {type(exc).__name__}: {exc}") from exc
