"""The scheduler <-> executor edge as pure data: what a step should do and what it produced.

``core/`` plans with these and ``messages.py`` re-exports them with the other messages.
Frozen, tuples only, never an ``mx.array``: token ids, block ids and numbers.
"""

from __future__ import annotations

from typing import Any, NewType

import attrs

from .params import SamplingParams
from .speculative import SpecDecodeCounts

RequestId = NewType("RequestId", str)
BlockId = NewType("BlockId", int)

_frozen = attrs.frozen(slots=True, kw_only=True)


@_frozen
class TokenLogprob:
    """A sampled token's log-probability and the ``top`` most likely (id, logprob) pairs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@_frozen
class NewSequence:
    """A sequence entering the model: prefill ``prompt_token_ids[num_cached_tokens:]``.

    A preempted request comes back with the tokens it had already produced appended to its
    prompt (``num_output_tokens`` of them): it is recomputed, and its sampler, penalties and
    ``max_tokens`` carry on from where it stopped.
    """

    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams
    num_cached_tokens: int = 0
    #: The cached entries to splice: full blocks in order, then at most one tail (a
    #: checkpoint at ``num_cached_tokens``, which need not be a multiple of the block size).
    cached_block_ids: tuple[BlockId, ...] = ()
    num_output_tokens: int = 0
    #: Those of ``cached_block_ids`` to read back from the disk tier first: (id, block hash).
    disk_blocks: tuple[tuple[BlockId, bytes], ...] = ()
    #: Running requests that had their first token before this one arrived: streams its
    #: prefill must not slow down much (requests that arrived together wait for each other).
    protects: tuple[RequestId, ...] = ()
    #: The prompt's images and videos (``messages.MediaInput``, numpy), for a VLM runner.
    media: tuple[Any, ...] = ()

    @property
    def output_token_ids(self) -> tuple[int, ...]:
        """The tokens produced before a preemption (the tail of ``prompt_token_ids``)."""
        return self.prompt_token_ids[len(self.prompt_token_ids) - self.num_output_tokens :]

    @property
    def max_new_tokens(self) -> int:
        """Tokens still to generate: ``max_tokens`` less those produced before."""
        assert self.params.max_tokens is not None, "admission resolves max_tokens"
        return self.params.max_tokens - self.num_output_tokens


@_frozen
class BlockStore:
    """Keep the executor's copy ``block_index`` of commit ``ready_id`` as prefix block ``block_id``
    (``block_index == -1``: the commit's tail checkpoint; ``-2 - k``: its ``k``-th boundary
    snapshot, see ``pool_types.boundary_store_index``)."""

    ready_id: int
    block_index: int
    block_id: BlockId


@_frozen
class StepPlan:
    """One model step. In order: keep the ``store_blocks`` copies (and free the other copies
    of their ``ready_id``s), drop the ``drop_blocks`` arrays, drop ``finished_ids``, start
    ``new_seqs`` (splicing their cached blocks), decode ``decode_ids``."""

    step_id: int
    new_seqs: tuple[NewSequence, ...] = ()
    decode_ids: tuple[RequestId, ...] = ()
    finished_ids: tuple[RequestId, ...] = ()
    store_blocks: tuple[BlockStore, ...] = ()
    released_ready_ids: tuple[int, ...] = ()
    drop_blocks: tuple[BlockId, ...] = ()
    #: Of ``drop_blocks``, the full blocks to write to the disk tier first: (id, block hash).
    spill_blocks: tuple[tuple[BlockId, bytes], ...] = ()
    #: Empty the disk tier (``DELETE /v1/cache``).
    clear_disk: bool = False
    #: A join plan (core/plan_join.py): run it in the step of the plan queued before it, if that
    #: has not started.
    join_previous: bool = False

    @property
    def is_empty(self) -> bool:
        return not (
            self.new_seqs
            or self.decode_ids
            or self.finished_ids
            or self.released_ready_ids
            or self.drop_blocks
            or self.clear_disk
        )


@_frozen
class RequestWaiting:
    """On the plan edge beside the plans: a request was admitted while plans are in flight, so
    the scheduler can start it only at the next plan boundary. The executor ends the current
    plan's run-ahead at its next step (the runner's ``starts_waiting``): the new request waits
    about one step, not a whole run-ahead. A hint: it produces no result."""


PlanMessage = StepPlan | RequestWaiting


@_frozen
class KVReady:
    """The executor copied full blocks ``first_block ..`` of ``token_ids``'s KV (``block_nbytes``
    bytes each) and holds them under ``ready_id`` until a plan says which to keep.

    ``tail_at``: it also holds a checkpoint of the first ``tail_at`` tokens (``tail_nbytes``
    bytes): the KV after the last full block, and the state of the model's sliding-window and
    recurrent layers there. ``blocks_end_hits`` is False for such models: a hit must end at a
    checkpoint, never at a bare block."""

    request_id: RequestId
    ready_id: int
    token_ids: tuple[int, ...]
    first_block: int
    block_nbytes: tuple[int, ...]
    tail_at: int | None = None
    tail_nbytes: int = 0
    blocks_end_hits: bool = True
    #: Snapshots of the sliding-window / recurrent layers taken inside the prefill at these
    #: block boundaries (``cache.state_snapshot_blocks``), and their sizes: checkpoints where a
    #: shared prefix's hit may end.
    boundary_at: tuple[int, ...] = ()
    boundary_nbytes: tuple[int, ...] = ()


@_frozen
class StepResult:
    """What one step produced: sampled tokens per request, and per-request failures.

    ``logprobs`` holds entries only for requests that asked, aligned with their ``sampled``.
    A plan that runs several decode steps hands each step's tokens over as the step ends, in
    results with ``plan_continues`` set; its last result (``plan_continues`` False) carries the
    last step's tokens and everything else: failures, the prompts' KV, memory.
    """

    step_id: int
    sampled: tuple[tuple[RequestId, tuple[int, ...]], ...] = ()
    logprobs: tuple[tuple[RequestId, tuple[TokenLogprob, ...]], ...] = ()
    kv_ready: tuple[KVReady, ...] = ()
    failed: tuple[tuple[RequestId, str], ...] = ()
    elapsed_s: float = 0.0
    #: MLX memory after the step, in bytes: (active, peak, buffer cache).
    memory: tuple[int, int, int] = (0, 0, 0)
    #: Seconds of vision encoding in this step, one per image/video prompt encoded (VLM runner).
    vision_encode_s: tuple[float, ...] = ()
    #: Of a new sequence's ``num_cached_tokens``, how many the executor recomputed after all
    #: (disk-tier blocks it could not read back): its reported ``cached_tokens`` drop by those.
    recomputed: tuple[tuple[RequestId, int], ...] = ()
    #: What speculative decoding did in this step (worker/speculative/runner.py); None when it did nothing.
    spec_decode: SpecDecodeCounts | None = None
    #: The plan ran in the next plan's step (core/plan_join.py): that step's result follows.
    ran_in_next: bool = False
    #: Tokens of a step inside a plan that runs on: more results of the same plan follow.
    plan_continues: bool = False
