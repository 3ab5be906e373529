"""What every runner does the same way, on the executor's thread; imports no MLX.

A runner kind subclasses :class:`RunnerBase` and writes only what differs: how it loads,
inserts sequences, advances them one step and removes them (and, for the prefix cache,
where a sequence's KV is). The base keeps the per-request bookkeeping: the live sequences
by request id, who asked for logprobs, per-request failures (``guard_processors`` records
them in :attr:`RunnerBase.failures`), the finish by the one termination rule
(core/termination.py), the prefix blocks' plan operations, and the :class:`StepResult`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ..core.termination import Termination
from ..messages import KVReady, ModelInfo, NewSequence, RequestId, StepPlan, StepResult, TokenLogprob
from ..runner_kinds import RunnerShape

if TYPE_CHECKING:
    from ..config.sections import EngineConfig, EngineSection


@attrs.define(slots=True, eq=False)
class LiveSequence:
    """One sequence in the model: what it was started with, what it has emitted since,
    and the runner's own handle on it (a uid in a batch, a generator and its cache...)."""

    seq: NewSequence
    termination: Termination
    handle: Any = None
    emitted: list[int] = attrs.field(factory=list)

    @property
    def request_id(self) -> RequestId:
        return self.seq.request_id

    @property
    def num_output_tokens(self) -> int:
        """Output tokens so far, counting those produced before a preemption."""
        return self.seq.num_output_tokens + len(self.emitted)


@attrs.frozen(slots=True)
class Emission:
    """What one step produced for one sequence: k >= 1 tokens, with the rows their logprobs
    come from (one per token, or none when nobody asked). ``ended``: the runner has already
    let the sequence go (its own stop logic); ``final``: runner data for the finished
    sequence's KV (e.g. mlx-lm's prompt cache), read by :meth:`RunnerBase._finished_ready`."""

    request_id: RequestId
    tokens: tuple[int, ...]
    rows: tuple[Any, ...] = ()
    ended: bool = False
    final: Any = None


@attrs.frozen(slots=True)
class Advance:
    """One step of the model: each sequence's tokens, and the sequences whose prompt is now
    fully processed (their prompt KV can go to the prefix store)."""

    emissions: Sequence[Emission] = ()
    prompts_done: Sequence[RequestId] = ()


class RunnerBase:
    """Executes step plans; created and used only on the executor's thread.

    Subclasses implement :meth:`_load`, :meth:`_insert`, :meth:`_advance` and
    :meth:`_remove`, and may override :meth:`_prompt_ready`, :meth:`_finished_ready`,
    :meth:`_logprobs`, :meth:`_memory` and :meth:`_close`.
    """

    #: The kind name this class runs as (runner_kinds.py), reported in ``ModelInfo.runner_kind``.
    kind: ClassVar[str] = ""
    #: What :meth:`shape` reports, unless a kind's values depend on the configuration.
    plans_in_flight: ClassVar[int] = 1
    max_tokens_per_step: ClassVar[int] = 1

    @classmethod
    def max_running(cls, engine: EngineSection) -> int:
        return engine.max_num_seqs

    @classmethod
    def results_per_plan(cls, engine: EngineSection) -> int:
        """Most results one plan gives (one per step, for a kind that runs several steps a plan)."""
        return 1

    @classmethod
    def shape(cls, cfg: EngineConfig) -> RunnerShape:
        """How the scheduler drives this kind under ``cfg`` (read before the runner is built)."""
        return RunnerShape(
            plans_in_flight=cls.plans_in_flight,
            max_tokens_per_step=cls.max_tokens_per_step,
            max_running=cls.max_running(cfg.engine),
            results_per_plan=cls.results_per_plan(cfg.engine),
        )

    def __init__(self, cfg: EngineConfig, *, request_waiting: threading.Event | None = None):
        """``request_waiting``: set by whoever feeds this runner plans (the executor) while a
        request waits for the next plan boundary; without it, none ever does."""
        self._cfg = cfg
        self._request_waiting = request_waiting or threading.Event()
        self._info: ModelInfo | None = None
        self._live: dict[RequestId, LiveSequence] = {}
        #: Requests whose own processing failed this step, with the cause.
        self.failures: dict[str, str] = {}
        #: The prefix store's side on this thread (a ``PrefixBlocks``), or None without one.
        self._prefix: Any = None
        #: Where a plan's steps go as each one ends while the plan runs on (:meth:`_publish`):
        #: set by whoever feeds this runner plans (the executor). None: a plan's tokens all
        #: come in its result.
        self.publish: Callable[[StepResult], None] | None = None
        #: The plan running now, and when its unpublished steps began (:meth:`_publish`).
        self._step_id = 0
        self._steps_started = 0.0

    def starts_waiting(self) -> bool:
        """Whether a request waits for the next plan boundary (a queued plan starts a sequence,
        or the scheduler holds one): a runner running ahead stops at its next step."""
        return self._request_waiting.is_set()

    # -- what a runner kind writes ---------------------------------------------------------

    def _load(self) -> ModelInfo:
        raise NotImplementedError

    def _insert(self, live: list[LiveSequence]) -> None:
        """Start these sequences (set each one's ``handle``)."""
        raise NotImplementedError

    def _advance(self, live: list[LiveSequence]) -> Advance:
        """One step for these sequences (new ones first, in plan order)."""
        raise NotImplementedError

    def _remove(self, live: list[LiveSequence]) -> None:
        """Let these sequences go (the runner's own handles on them)."""
        raise NotImplementedError

    def _prompt_ready(self, live: LiveSequence) -> KVReady | None:
        return None

    def _finished_ready(self, live: LiveSequence, emission: Emission) -> KVReady | None:
        return None

    def _logprobs(self, rows: Sequence[Any], tokens: Sequence[int], num_tops: Sequence[int]) -> list[TokenLogprob]:
        """Each (row, sampled token)'s logprob and its ``num_tops[i]`` most likely tokens, together."""
        raise NotImplementedError

    def _memory(self, *, idle: bool) -> tuple[int, int, int]:
        return (0, 0, 0)

    def _close(self) -> None:
        """Free the model and whatever else :meth:`_load` made."""

    # -- the Runner protocol -----------------------------------------------------------------

    def load(self) -> ModelInfo:
        self._info = attrs.evolve(self._load(), runner_kind=self.kind)
        return self._info

    @property
    def num_sequences(self) -> int:
        return len(self._live)

    def execute(self, plan: StepPlan) -> StepResult:
        self._step_id, self._steps_started = plan.step_id, time.perf_counter()
        assert self._info is not None, "load() first"
        if self._prefix is not None:
            self._prefix.apply(plan)
        self._drop(plan.finished_ids)
        new = [LiveSequence(seq, Termination.of(seq.params, self._info.eos_token_ids)) for seq in plan.new_seqs]
        if new:
            self._live.update((live.request_id, live) for live in new)
            self._insert(new)
        order = (*(s.request_id for s in plan.new_seqs), *plan.decode_ids)
        # A plan built before the scheduler saw a finish may still name the sequence.
        advance = self._advance([self._live[rid] for rid in order if rid in self._live])
        kv_ready = [
            self._prompt_ready(self._live[rid])
            for rid in advance.prompts_done
            if rid in self._live and rid not in self.failures
        ]
        sampled, logprobs, finished_kv = self._collect(advance.emissions)
        failed = tuple((RequestId(rid), message) for rid, message in self.failures.items())
        self.failures.clear()
        self._drop(tuple(rid for rid, _ in failed))
        return StepResult(
            step_id=plan.step_id,
            sampled=sampled,
            logprobs=logprobs,
            failed=failed,
            kv_ready=tuple(ready for ready in [*kv_ready, *finished_kv] if ready is not None),
            elapsed_s=time.perf_counter() - self._steps_started,
            memory=self._memory(idle=not self._live),
            recomputed=self._prefix.take_recomputed() if self._prefix is not None else (),
        )

    def _publish(self, advance: Advance) -> Advance:
        """Hand the tokens of this plan's steps so far to whoever feeds the runner (``publish``),
        while the plan runs on: a runner that runs several steps in one plan calls this after
        each one, so every token leaves as soon as its step ends. Returns what is left for the
        plan's result: the prompts done (their KV goes with the result), or ``advance`` itself
        when nobody takes steps early."""
        if self.publish is None or not advance.emissions:
            return advance
        sampled, logprobs, finished_kv = self._collect(advance.emissions)
        if sampled:
            now = time.perf_counter()
            self.publish(
                StepResult(
                    step_id=self._step_id,
                    sampled=sampled,
                    logprobs=logprobs,
                    kv_ready=tuple(ready for ready in finished_kv if ready is not None),
                    elapsed_s=now - self._steps_started,
                    plan_continues=True,
                )
            )
            self._steps_started = now
        return Advance((), advance.prompts_done)

    def _collect(
        self, emissions: Sequence[Emission]
    ) -> tuple[
        tuple[tuple[RequestId, tuple[int, ...]], ...],
        tuple[tuple[RequestId, tuple[TokenLogprob, ...]], ...],
        list[KVReady | None],
    ]:
        """The termination rule over a step's emissions: (tokens kept per request, their
        logprobs where asked, the KV of the sequences that finished). A failed request's tokens
        are not delivered."""
        sampled, wanted, finished_kv = [], [], []
        for emission in emissions:
            if emission.request_id in self.failures or emission.request_id not in self._live:
                continue
            tokens, num_top, ready = self._accept(emission)
            if emission.request_id in self.failures:
                continue
            sampled.append((emission.request_id, tokens))
            if num_top is not None:
                wanted.append((emission.request_id, emission.rows[: len(tokens)], tokens, num_top))
            finished_kv.append(ready)
        return tuple(sampled), self._step_logprobs(wanted), finished_kv

    def _accept(self, emission: Emission) -> tuple[tuple[int, ...], int | None, KVReady | None]:
        """Apply the termination rule to one emission: (tokens kept, the request's top-logprobs
        count or None when it wants no logprobs, the finished sequence's KV). A finished sequence
        leaves the runner at once."""
        live = self._live[emission.request_id]
        keep, reason = live.termination.scan(live.num_output_tokens, emission.tokens)
        tokens = emission.tokens[:keep]
        num_top = live.seq.params.logprobs
        live.emitted.extend(tokens)
        ready = None
        if reason is not None:
            ready = self._finished_ready(live, emission)
            self._drop((live.request_id,), already_ended=emission.ended)
        elif emission.ended:  # the runner's own stop logic disagrees with the rule
            self.failures[live.request_id] = (
                f"the runner ended the sequence after {live.num_output_tokens} tokens, before its termination rule did"
            )
            del self._live[live.request_id]
        return tokens, num_top, ready

    def _step_logprobs(
        self, wanted: Sequence[tuple[RequestId, Sequence[Any], tuple[int, ...], int]]
    ) -> tuple[tuple[RequestId, tuple[TokenLogprob, ...]], ...]:
        """The logprobs of every (request, its rows, its kept tokens, top count) in ``wanted``,
        from one :meth:`_logprobs` call for the whole step."""
        asked = [
            (index, row, token, num_top)
            for index, (_rid, rows, kept, num_top) in enumerate(wanted)
            for row, token in zip(rows, kept, strict=False)
        ]
        found: list[list[TokenLogprob]] = [[] for _ in wanted]
        if asked:
            owners, rows, tokens, num_tops = zip(*asked, strict=True)
            for index, entry in zip(owners, self._logprobs(rows, tokens, num_tops), strict=True):
                found[index].append(entry)
        return tuple((rid, tuple(entries)) for (rid, *_), entries in zip(wanted, found, strict=True))

    def _drop(self, request_ids: Sequence[RequestId], *, already_ended: bool = False) -> None:
        gone = [self._live.pop(rid) for rid in request_ids if rid in self._live]
        if gone and not already_ended:
            self._remove(gone)

    def close(self) -> None:
        try:
            if self._live:
                self._remove(list(self._live.values()))
            self._live.clear()
            if self._prefix is not None:
                self._prefix.close()
        finally:
            self._close()
