"""What a step's result does to the requests, on the scheduler actor's side: counters corrected,
metrics observed, tokens delivered, failures and departures turned into finishes, and the
newest requests preempted when the batch must grow. Plain functions over the actor's core
scheduler, its :class:`Delivery` and its metrics; they never await."""

from __future__ import annotations

import logging

from ...core.plan_join import is_placeholder
from ...core.request import Request, RequestStatus
from ...core.scheduler import Scheduler
from ...errors import RequestProcessingError, VllmMlxTrioError
from ...messages import StepResult
from ...metrics import EngineMetrics
from .delivery import Delivery

logger = logging.getLogger(__name__)


def apply_result(
    result: StepResult, *, scheduler: Scheduler, delivery: Delivery, metrics: EngineMetrics | None
) -> None:
    """Everything ``result`` says about the running requests: a plan's last result, or the tokens
    of a step of a plan that runs on (``plan_continues``)."""
    running = scheduler.running
    model_step = not is_placeholder(result)  # a join plan's placeholder ran no step of its own
    for request_id, recomputed in result.recomputed:  # disk blocks the executor could not read
        request = running.get(request_id)
        if request is not None and result.step_id >= request.first_valid_step:
            request.num_cached_tokens -= recomputed
    if metrics is not None and model_step:
        metrics.on_step(sum(len(tokens) for rid, tokens in result.sampled if rid in running), result.elapsed_s)
        metrics.on_vision_encode(result.vision_encode_s)
        if result.spec_decode is not None:
            metrics.on_spec_decode(result.spec_decode)
    for request in scheduler.apply(result):
        delivery.time_request(request)
        deliver(request, scheduler=scheduler, delivery=delivery)
    for request_id, message in result.failed:
        request = scheduler.running.get(request_id)
        if request is not None and result.step_id >= request.first_valid_step:
            scheduler.abort(request_id, RequestStatus.FINISHED_ERROR)
            delivery.fail(request, RequestProcessingError(f"The request failed: {message}"))


def deliver(request: Request, *, scheduler: Scheduler, delivery: Delivery) -> None:
    """Hand the request's tokens out; a client found gone aborts the request."""
    if not delivery.deliver(request):
        if not request.status.is_finished:
            scheduler.abort(request.request_id, RequestStatus.FINISHED_ABORTED)
        delivery.finish_aborted(request)


def abort_departed(*, scheduler: Scheduler, delivery: Delivery) -> None:
    """Abort every request whose client said it left (``Departed``), queued or running; called
    between two steps, when every request held is in one or the other."""
    for request_id in delivery.take_departed():
        request = scheduler.abort(request_id, RequestStatus.FINISHED_ABORTED)
        if request is not None:
            delivery.finish_aborted(request)


def fail_held(error: VllmMlxTrioError, *, scheduler: Scheduler, delivery: Delivery) -> None:
    """Fail every request held now (queued or running) with ``error``, in-band; the engine
    itself goes on. The shutdown drain's deadline (``FailAll``)."""
    for request in [*scheduler.running.values(), *scheduler.waiting]:
        scheduler.abort(request.request_id, RequestStatus.FINISHED_ERROR)
        delivery.time_end(request)
        delivery.fail(request, error)


def preempt_for_growth(scheduler: Scheduler, metrics: EngineMetrics | None) -> None:
    """Make room for the batch to grow: the lowest-priority, newest running requests go back to the queue."""
    record_preemptions(scheduler.preempt_for_growth(), "to stay within the KV budget", metrics)


def record_preemptions(requests: list[Request], why: str, metrics: EngineMetrics | None) -> None:
    """Log and count requests that went back to the queue, to be recomputed later."""
    for request in requests:
        logger.info(
            "preempted request %s %s (%d tokens held, priority %d, run %d)",
            request.request_id,
            why,
            request.num_tokens,
            request.params.priority,
            request.num_preemptions,
        )
        if metrics is not None:
            metrics.on_preemption()
