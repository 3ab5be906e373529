"""What the scheduler reports: its statistics and each request's snapshot."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ...core.request import Request

if TYPE_CHECKING:
    from ...core.scheduler import Scheduler
    from .delivery import Delivery


@attrs.frozen(slots=True, kw_only=True)
class SchedulerStatistics:
    """A snapshot of the scheduler, for tests, ``/health`` and metrics."""

    num_waiting: int
    num_running: int
    num_steps: int
    num_finished: int
    num_aborted: int
    running_ids: tuple[str, ...]
    waiting_ids: tuple[str, ...]
    #: Every request the scheduler holds, queued or running, oldest first.
    requests: tuple[RequestSnapshot, ...] = ()
    admit_queue_depth: int = 0
    plans_in_flight: int = 0
    mlx_active_bytes: int = 0
    mlx_peak_bytes: int = 0
    mlx_cache_bytes: int = 0
    #: Requests sent back to the queue to stay within the KV budget, since the start.
    num_preemptions: int = 0
    #: KV token slots the running batch holds (rows x longest row; a prefix rows share counted once), and the
    #: budget for them.
    kv_tokens_held: int = 0
    #: What the running batch would hold with a copy of the shared prefix in every row.
    kv_tokens_unshared: int = 0
    kv_budget_tokens: int | None = None


@attrs.frozen(slots=True, kw_only=True)
class RequestSnapshot:
    """One request as ``/v1/status`` shows it (times on the Trio clock, seconds)."""

    request_id: str
    phase: str
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    arrival_time: float
    time_to_first_token: float | None
    num_preemptions: int = 0

    @classmethod
    def of(cls, request: Request) -> RequestSnapshot:
        first = request.first_token_time
        return cls(
            request_id=request.request_id,
            phase=request.phase,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=request.num_output_tokens,
            num_cached_tokens=request.num_cached_tokens,
            arrival_time=request.arrival_time,
            time_to_first_token=None if first is None else first - request.arrival_time,
            num_preemptions=request.num_preemptions,
        )


def scheduler_statistics(
    s: Scheduler,
    *,
    delivery: Delivery,
    num_steps: int,
    admit_queue_depth: int,
    plans_in_flight: int,
    memory: tuple[int, int, int],
) -> SchedulerStatistics:
    """The snapshot of a scheduler actor: its core scheduler, its delivery counts, its steps and
    queues, and the MLX memory (active, peak, cache bytes) its last result reported."""
    active, peak, cache = memory
    return SchedulerStatistics(
        num_waiting=s.num_waiting,
        num_running=s.num_running,
        num_steps=num_steps,
        num_finished=delivery.num_finished,
        num_aborted=delivery.num_aborted,
        running_ids=tuple(s.running),
        waiting_ids=tuple(r.request_id for r in s.waiting),
        requests=tuple(RequestSnapshot.of(r) for r in (*s.running.values(), *s.waiting)),
        admit_queue_depth=admit_queue_depth,
        plans_in_flight=plans_in_flight,
        mlx_active_bytes=active,
        mlx_peak_bytes=peak,
        mlx_cache_bytes=cache,
        num_preemptions=s.num_preemptions,
        kv_tokens_held=s.kv_tokens_held,
        kv_tokens_unshared=s.kv_tokens_unshared,
        kv_budget_tokens=s.kv_budget_tokens,
    )
