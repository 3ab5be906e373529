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
Jobs (an embedding model's :class:`EmbedJob`, sent by the facade on its clone of the plan
channel) queue in the same inbox; the jobs queued back to back run together, between steps,
through the runner's ``run_jobs``, and each is answered on its own reply channel.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

import trio

from ..core.plan_join import can_join, joined, placeholder_result
from ..errors import ExecutorCrashedError, InvalidRequestError, VllmMlxTrioError
from ..messages import EmbedJob, EmbedReply, ExecutorMessage, ModelInfo, RequestWaiting, StepPlan, StepResult
from ..worker.registry import Runner

#: The stop marker: the thread closes the runner and ends when it takes this from its inbox.
_STOP = object()
#: Most jobs the thread takes together (the runner batches their rows): a bound on one
#: batch's host memory, far above what concurrent HTTP requests queue between two batches.
MAX_JOBS_PER_BATCH = 64


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

    def put_job(self, job: EmbedJob) -> None:
        self._queue.put(job)

    def leftover_jobs(self) -> list[EmbedJob]:
        """(On the Trio side, once the thread has stopped or been abandoned.) The jobs it never
        took, so their replies can be closed."""
        jobs = []
        while (item := self._take(block=False)) is not None:
            if isinstance(item, EmbedJob):
                jobs.append(item)
        return jobs

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

    def next_work(self) -> list[StepPlan] | list[EmbedJob] | None:
        """The next plan to run, with those queued right behind it that can run in the same
        step; or the next job with the jobs queued right behind it (blocks for the first);
        None: stop now."""
        first = self._take(block=True)
        if self._abandoned.is_set() or not isinstance(first, StepPlan | EmbedJob):
            return None
        if isinstance(first, EmbedJob):
            return self._jobs_after(first)
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

    def _jobs_after(self, first: EmbedJob) -> list[EmbedJob]:
        jobs = [first]
        while len(jobs) < MAX_JOBS_PER_BATCH and (following := self._take(block=False)) is not None:
            if not isinstance(following, EmbedJob):
                self._held = following
                break
            jobs.append(following)
        return jobs

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
        plan_recv: trio.MemoryReceiveChannel[ExecutorMessage],
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
            try:
                async with trio.open_nursery() as nursery:
                    model_info = await nursery.start(self._run_thread, inbox)
                    task_status.started(model_info)
                    async for message in self._plan_recv:
                        if isinstance(message, RequestWaiting):
                            inbox.request_waiting()
                        elif isinstance(message, EmbedJob):
                            inbox.put_job(message)
                        else:
                            inbox.put(message)
                    inbox.stop()
            finally:
                for job in inbox.leftover_jobs():
                    job.reply.close()  # its caller hears that the engine stopped

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
            while (work := inbox.next_work()) is not None:
                if isinstance(work[0], EmbedJob):
                    self._run_jobs(runner, work, trio_token)  # type: ignore[arg-type]
                    continue
                plans: list[StepPlan] = work  # type: ignore[assignment]
                result = _execute(runner, joined(plans))
                # Fire and forget, one result per plan in order: the thread goes straight on to
                # the next queued plan.
                for plan in plans[:-1]:
                    trio_token.run_sync_soon(self._deliver, placeholder_result(plan, result), inbox)
                trio_token.run_sync_soon(self._deliver, result, inbox)
        finally:
            runner.close()

    def _run_jobs(self, runner: Runner, jobs: list[EmbedJob], trio_token: trio.lowlevel.TrioToken) -> None:
        """Run queued jobs together through the runner and answer each (fire and forget). A
        runner without ``run_jobs`` answers none: every job gets the error. An unexpected
        failure answers every job and kills the engine, as a failed step does."""
        run = getattr(runner, "run_jobs", None)
        if run is None:
            error = InvalidRequestError("This model does not support the Embeddings API: it is not an embedding model.")
            replies = [EmbedReply(error=error)] * len(jobs)
        else:
            try:
                replies = run(jobs)
            except VllmMlxTrioError as exc:
                replies = [EmbedReply(error=exc)] * len(jobs)
            except Exception as exc:  # boundary: an MLX failure kills the engine, with a clear cause
                crash = ExecutorCrashedError(f"embedding failed: {type(exc).__name__}: {exc}")
                for job in jobs:
                    trio_token.run_sync_soon(_answer, job, EmbedReply(error=crash))
                raise crash from exc
        for job, reply in zip(jobs, replies, strict=True):
            trio_token.run_sync_soon(_answer, job, reply)

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


def _answer(job: EmbedJob, reply: EmbedReply) -> None:
    """Send a job's answer and close its reply channel; runs in Trio and must not raise."""
    with job.reply, contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        job.reply.send_nowait(reply)  # else its caller has left


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


def keeping_runners(make_runner: Callable[[Any], Any], runners: list) -> Callable[[Any, Any], ExecutorActor]:
    """An ``executor_factory`` for ``open_engine`` whose runners stay reachable (tests and benches
    look at the MLX-side state through them): the real executor, each runner it builds by
    ``make_runner(request_waiting)`` appended to ``runners``."""

    def make(request_waiting):
        runner = make_runner(request_waiting)
        runners.append(runner)
        return runner

    def build(plan_recv, result_send):
        return ExecutorActor(plan_recv=plan_recv, result_send=result_send, runner_factory=make)

    return build
