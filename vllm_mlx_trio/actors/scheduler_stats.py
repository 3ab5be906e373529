"""What the scheduler reports: its statistics and each request's snapshot."""

from __future__ import annotations

import attrs

from ..core.request import Request


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
    #: KV token slots the running batch holds (rows x longest row), and the budget for them.
    kv_tokens_held: int = 0
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
