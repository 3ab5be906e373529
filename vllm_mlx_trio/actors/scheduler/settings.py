"""What the scheduler actor is configured with: the runner's shape and the engine's limits."""

from __future__ import annotations

import attrs

from ...core.scheduler import Scheduler
from ...core.shared_prefix import SharedPrefixCount


def max_outstanding(plans_in_flight: int, max_running: int) -> int:
    """Plans (and so results) outstanding at most: join plans only where a plan can be
    queued behind the running one, and each starts one of ``max_running`` requests."""
    return plans_in_flight + (max_running if plans_in_flight >= 2 else 0)


@attrs.frozen(slots=True, kw_only=True)
class SchedulerSettings:
    """The numbers a :class:`~.scheduler.SchedulerActor` schedules by (topology builds them from the
    configuration and the loaded runner; tests from the defaults)."""

    eos_token_ids: tuple[int, ...]
    #: Requests running at once (the runner's ``max_running``).
    max_running: int = 1
    #: Plans outstanding on the executor edge (the runner's; 1 is lock-step).
    plans_in_flight: int = 1
    #: Most tokens one step gives one request (speculative steps give several).
    max_tokens_per_step: int = 1
    #: Tokens a request's output collects before it is delivered (engine.stream_interval).
    stream_interval: int = 1
    #: A step running longer than this fails the engine (limits.engine_stall_timeout_s); None: never.
    stall_timeout_s: float | None = None
    #: KV token slots the running batch may hold (the memory-aware budget); None: unbounded.
    kv_budget_tokens: int | None = None
    #: engine.max_num_batched_tokens, the runner's prefill chunk, and its chunk while rows decode
    #: (see core/scheduler.py).
    max_num_batched_tokens: int | None = None
    prefill_chunk_tokens: int | None = None
    prefill_chunk_decoding_tokens: int | None = None
    #: Running rows that share a cached prefix hold it once (the runner said so): its block size and the
    #: fewest tokens a row shares (cache.block_size, cache.share_prefix_min_tokens); None: no sharing.
    shared_prefix: tuple[int, int] | None = None

    @property
    def max_outstanding(self) -> int:
        return max_outstanding(self.plans_in_flight, self.max_running)

    def new_scheduler(self) -> Scheduler:
        """An empty core scheduler with these limits."""
        return Scheduler(
            max_running=self.max_running,
            kv_budget_tokens=self.kv_budget_tokens,
            # Tokens, not steps: each plan in flight, and the next step, may add this many.
            lookahead_tokens=(self.plans_in_flight + 1) * self.max_tokens_per_step,
            max_num_batched_tokens=self.max_num_batched_tokens,
            prefill_chunk_tokens=self.prefill_chunk_tokens,
            prefill_chunk_decoding_tokens=self.prefill_chunk_decoding_tokens,
            shared_prefix=None if self.shared_prefix is None else SharedPrefixCount(*self.shared_prefix),
        )
