"""One model sharded over processes with ``mx.distributed``: rank 0 drives, the others follow.

``engine.mode = "distributed"`` selects :class:`DistributedRunner`, a wrapper around the batched
runner (:data:`INNER_RUNNER`). The processes are started by ``mlx.launch``
(``mlx.launch -n 2 --backend ring vllm-mlx-trio serve config.toml``). Rank 0 runs the HTTP
front and every actor, as a single process does; its executor thread drives this runner. The
other ranks run :func:`follow`: the same inner runner on their shard, and nothing else.

Each step, rank 0 broadcasts the :class:`StepPlan` to every rank as plain data (ids, numbers
and specs: :func:`plain_plan` leaves out what admission compiled, such as a constraint's
grammar), then every rank executes it on its shard; the model's own collectives (``all_sum`` in
the sharded layers) keep them in lock-step, and every rank gets the same logits. Each row's
token is sampled once, on rank 0, and broadcast (worker/sharded_batch.py): the other ranks
never sample, so no sampler state has to agree. A new sequence whose part of the plan cannot
be encoded fails alone, with a clear error, and the step goes on without it
(:func:`encode_plan`). A stop marker (an empty plan message) ends the followers when rank 0's
runner closes.

Refused at load, with an error naming the combination: a vision-language checkpoint (the
sharded runner is the batched text runner), and, at configuration load, speculative decoding
and the disk tier (config/sections.py).

A rank that dies closes its sockets. A follower waiting for a plan gets an error at once ("connection to a peer
was lost") and exits 1. Rank 0 mid-step may instead wait forever in MLX (the ring backend
fails its pending tasks without waking the waiter): the engine's step watchdog
(``limits.engine_stall_timeout_s``) then fails every request in-band, answers 503 and exits 1,
as for any engine death. :class:`CollectiveWatchdog` is the last resort on every rank: a step
that outlasts ``distributed.collective_timeout_s`` (on rank 0: after the stall timeout) makes
the process log the cause and exit 1.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from ..errors import ConfigError, ModelLoadError
from ..logs import configure_logging
from ..messages import ModelInfo, RequestId, StepPlan, StepResult
from ..runner_kinds import DISTRIBUTED, RunnerShape
from . import loading
from .sharded_batch import ShardedBatchRunner

logger = logging.getLogger(__name__)

#: Exit status of a rank whose collective timed out (as of engine death on rank 0).
COLLECTIVE_TIMEOUT_EXIT = 1
#: The runner every rank runs on its shard: continuous batching, as a single process does,
#: each row's token sampled on rank 0 and broadcast.
INNER_RUNNER = ShardedBatchRunner
_STOP = b""


def init_group(cfg: Any) -> mx.distributed.Group:
    """The process group ``mlx.launch`` set up, for ``distributed.backend`` (strict: a
    misconfigured launch is an error, not a silent group of one)."""
    dist = cfg.distributed
    group = mx.distributed.init(strict=True, backend=dist.backend)
    tensor = dist.tensor or group.size()
    if tensor * dist.pipeline != group.size():
        raise ConfigError(
            f"distributed.tensor ({tensor}) x distributed.pipeline ({dist.pipeline}) must equal "
            f"the number of ranks mlx.launch started ({group.size()})"
        )
    return group


def rank_of(cfg: Any) -> int:
    """This process's rank (0 drives; the others follow)."""
    return init_group(cfg).rank()


class CollectiveWatchdog:
    """Exits the process when one collective section outlasts ``timeout_s``: a dead peer
    leaves a collective waiting forever, and nothing else can interrupt MLX's wait.

    Its thread waits for a guard to be armed, then for the guard's end with the deadline as the
    timeout (``threading.Event.wait``): a section that ends in time wakes it at once, one that
    does not is caught at its deadline. ``on_expire`` (the section's name) defaults to the exit.
    """

    def __init__(self, timeout_s: float, rank: int, *, on_expire: Callable[[str], None] | None = None):
        self._timeout_s = timeout_s
        self._rank = rank
        self._on_expire = on_expire or self._exit
        self._lock = threading.Lock()
        #: Under the lock: the armed section's deadline (None: none armed), its name, closed.
        self._deadline: float | None = None
        self._what = ""
        self._closed = False
        #: Set whenever those change; the thread clears it when it reads them.
        self._changed = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"collective-watchdog-{rank}", daemon=True)
        self._thread.start()

    def guard(self, what: str) -> _Guard:
        return _Guard(self, what)

    def close(self) -> None:
        """End the thread (the runner is closing); a section still armed is not watched."""
        with self._lock:
            self._closed = True
            self._changed.set()

    def _arm(self, what: str) -> None:
        with self._lock:
            self._deadline, self._what = time.monotonic() + self._timeout_s, what
            self._changed.set()

    def _disarm(self) -> None:
        with self._lock:
            self._deadline = None
            self._changed.set()

    def _watch(self) -> None:
        while True:
            self._changed.wait()
            with self._lock:
                self._changed.clear()
                closed, deadline, what = self._closed, self._deadline, self._what
            if closed:
                return
            if deadline is None or self._changed.wait(timeout=max(0.0, deadline - time.monotonic())):
                continue  # nothing armed, or it changed before the deadline: look again
            self._on_expire(what)
            return

    def _exit(self, what: str) -> None:
        logger.critical(
            "rank %d: %s did not finish within distributed.collective_timeout_s = %.1f s "
            "(a rank died or hangs); exiting",
            self._rank,
            what,
            self._timeout_s,
        )
        logging.shutdown()
        os._exit(COLLECTIVE_TIMEOUT_EXIT)


@attrs.define
class _Guard:
    watchdog: CollectiveWatchdog
    what: str

    def __enter__(self) -> None:
        self.watchdog._arm(self.what)

    def __exit__(self, *exc_info: object) -> None:
        self.watchdog._disarm()


class PlanChannel:
    """Rank 0's plans to every rank, as bytes over two ``all_sum``s (the length, then the
    bytes packed four to an int32, zero-padded): the other ranks add zeros, so each sum is
    rank 0's message, exactly (integers)."""

    def __init__(self, group: mx.distributed.Group):
        self._group = group
        #: The stream the model's own collectives run on: the runner queues the next step's
        #: forward pass (mx.async_eval) before returning, so a plan sent on another stream
        #: could interleave with that step's all_sums differently on each rank. On one stream
        #: every rank issues them in the same order.
        self.stream: Any = None

    def send(self, message: bytes) -> None:
        self._exchange(message)

    def receive(self) -> bytes:
        return self._exchange(None)

    def _sum(self, values: np.ndarray) -> np.ndarray:
        total = mx.distributed.all_sum(mx.array(values), group=self._group, stream=self.stream or mx.cpu)
        return np.array(total)

    def _exchange(self, message: bytes | None) -> bytes:
        size = int(self._sum(np.array([0 if message is None else len(message)], dtype=np.int32))[0])
        if size == 0:
            return _STOP
        words = -(-size // 4)
        if message is None:
            packed = np.zeros(words, dtype=np.int32)
        else:
            packed = np.frombuffer(message.ljust(words * 4, b"\0"), dtype=np.int32)
        return self._sum(packed).astype(np.int32).tobytes()[:size]


def plain_plan(plan: StepPlan) -> StepPlan:
    """The plan as the other ranks get it: every new sequence's parameters without what
    admission compiled from them (a constraint's grammar): only rank 0 samples."""
    if all(seq.params.grammar is None for seq in plan.new_seqs):
        return plan
    seqs = tuple(
        seq if seq.params.grammar is None else attrs.evolve(seq, params=attrs.evolve(seq.params, grammar=None))
        for seq in plan.new_seqs
    )
    return attrs.evolve(plan, new_seqs=seqs)


def encode_plan(plan: StepPlan) -> tuple[StepPlan, bytes, tuple[tuple[RequestId, str], ...]]:
    """(the plan to run, its bytes for the other ranks, the new sequences left out with why).

    A new sequence whose part of the plan cannot be encoded is left out of the plan, on every
    rank, and fails alone; the rest of the plan (ids and numbers) always encodes."""
    try:
        return plan, pickle.dumps(plain_plan(plan)), ()
    except Exception:  # boundary: some new sequence holds what pickle cannot encode; it fails alone
        refused = _unsendable(plan)
    gone = {rid for rid, _ in refused}
    kept = attrs.evolve(plan, new_seqs=tuple(seq for seq in plan.new_seqs if seq.request_id not in gone))
    return kept, pickle.dumps(plain_plan(kept)), refused


def _unsendable(plan: StepPlan) -> tuple[tuple[RequestId, str], ...]:
    """The plan's new sequences that cannot be encoded, each with the request's error."""
    refused = []
    for seq in plain_plan(plan).new_seqs:
        try:
            pickle.dumps(seq)
        except Exception as exc:  # boundary: what pickle raises for an object it cannot encode
            why = f"its step plan cannot be sent to the other ranks of the sharded model ({type(exc).__name__}: {exc})"
            refused.append((seq.request_id, why))
    return tuple(refused)


class _ShardedRunner:
    """The inner runner loaded on this rank's shard, with a plan channel and a watchdog."""

    def __init__(self, cfg: Any, *, request_waiting: threading.Event | None = None):
        """``request_waiting`` is not passed on: every rank must run the same steps, and only
        rank 0 would hear of a waiting request."""
        self._cfg = cfg
        self._group = init_group(cfg)
        self.rank = self._group.rank()
        self._inner = INNER_RUNNER(cfg, group=self._group)
        self._channel = PlanChannel(self._group)
        self._watchdog = CollectiveWatchdog(self.step_timeout_s(cfg), self.rank)
        #: Never called: a sharded plan runs one step (every rank must run the same steps).
        self.publish = None

    def step_timeout_s(self, cfg: Any) -> float:
        return cfg.distributed.collective_timeout_s

    def load(self) -> ModelInfo:
        refuse_vision_models(self._cfg.model)
        with loading.sharded_over(self._group, pipeline=self._cfg.distributed.pipeline > 1):
            info = self._inner.load()
        self._channel.stream = getattr(self._inner, "compute_stream", None)
        return attrs.evolve(info, runner_kind=DISTRIBUTED)


def refuse_vision_models(model_cfg: Any) -> None:
    """A vision-language checkpoint cannot be sharded: refused before any rank loads it."""
    if loading.is_vision_checkpoint(model_cfg):
        raise ModelLoadError(
            f'model {model_cfg.path!r} is a vision-language model: engine.mode = "distributed" shards text '
            'models only (serve it on one process with engine.mode = "vlm")'
        )


class DistributedRunner(_ShardedRunner):
    """Rank 0's runner: broadcast each plan, then run it on this rank's shard."""

    plans_in_flight = 1  # lock-step: the followers apply plans strictly in order
    max_tokens_per_step = 1

    def step_timeout_s(self, cfg: Any) -> float:
        """Rank 0 waits the engine's stall timeout first: that one fails the requests in-band
        (503, exit 1, like any engine death); this exit is the last resort after it."""
        return cfg.distributed.collective_timeout_s + (cfg.limits.engine_stall_timeout_s or 0.0)

    @classmethod
    def shape(cls, cfg: Any) -> RunnerShape:
        return RunnerShape(
            plans_in_flight=cls.plans_in_flight,
            max_tokens_per_step=cls.max_tokens_per_step,
            max_running=INNER_RUNNER.max_running(cfg.engine),
        )

    def execute(self, plan: StepPlan) -> StepResult:
        plan, message, refused = encode_plan(plan)
        for request_id, why in refused:
            logger.error("request %s failed: %s", request_id, why)
        with self._watchdog.guard(f"step {plan.step_id}"):
            self._channel.send(message)
            result = self._inner.execute(plan)
        return attrs.evolve(result, failed=(*result.failed, *refused)) if refused else result

    def close(self) -> None:
        try:
            with self._watchdog.guard("the stop broadcast"):
                self._channel.send(_STOP)
        finally:
            self._watchdog.close()
            self._inner.close()


class Follower(_ShardedRunner):
    """A rank other than 0: apply every plan rank 0 broadcasts, until the stop marker."""

    def run(self) -> None:
        self.load()
        logger.info("rank %d: loaded its shard; following rank 0", self.rank)
        try:
            while True:
                # Not bounded: rank 0 may be idle for hours. A rank 0 that dies closes its
                # sockets, and the ring backend raises at once ("connection to a peer was lost").
                message = self._channel.receive()
                if message == _STOP:
                    return
                plan = pickle.loads(message)  # rank 0 of this same launch sent it
                with self._watchdog.guard(f"step {plan.step_id}"):
                    self._inner.execute(plan)
        finally:
            self._watchdog.close()
            self._inner.close()


def follow(cfg: Any) -> int:
    """A follower rank's whole life; its exit status (1: a peer was lost or a step failed)."""
    configure_logging(cfg.logging)
    try:
        Follower(cfg).run()
    except Exception as exc:  # boundary: MLX's "connection to a peer was lost" and step errors
        logger.critical("follower rank stopping: %s: %s", type(exc).__name__, exc)
        return 1
    logger.info("rank 0 stopped; follower exiting")
    return 0
