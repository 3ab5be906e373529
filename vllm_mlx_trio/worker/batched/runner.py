"""Batched mode on the MLX thread: continuous batching through mlx-lm's ``BatchGenerator``.

Each step removes the sequences the scheduler dropped, inserts the new ones, and calls
``BatchGenerator.next()`` once: one decode step for every generating row (the next one is
already queued with ``mx.async_eval``) plus one chunk of the prompts being prefilled, so a
long prompt never freezes the other streams for long. The chunk is ``prefill_step_size`` when
no row decodes and ``prefill_step_size_decoding`` (smaller) while some do: mlx-lm reads the
generator's ``prefill_step_size`` at every ``next()``, so it is set before each step.

With ``engine.prefill_time_ratio`` set (the default) the runner prefills prompts itself
(worker/batched/prefill.py): the oldest prompt gets one chunk per plan, sized by measured time
(worker/batched/prefill_budget.py) beside the streams that were running before it arrived (a full
chunk every step otherwise), and enters the generator as a one-token prompt with its cache
once the rest of it is in, so no step pays mlx-lm's per-prompt-step fixed cost. Beside those
streams a plan runs ahead: its chunk first, then its decode steps within the run-ahead bounds
(``engine.chunk_run_ahead_ms``; the chunk's own time is not counted there).

While every row decodes, a plan runs several decode steps ("run-ahead", worker/batched/run_ahead.py).

Every row carries its own sampler (its own PRNG key), logits processors, stop token ids and
max_tokens; the generator ends a row itself at max_tokens or a stop token, where the one
termination rule (core/termination.py, applied by :class:`RunnerBase`) ends it too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import attrs
import mlx.core as mx
from mlx_lm.generate import BatchGenerator, StopSequences

from ...messages import KVReady, ModelInfo, RequestId, TokenLogprob
from ...runner_kinds import BATCHED
from ..cascade.sharing import InBatchSharing
from ..loading import load_for_serving, mlx_memory, sharding
from ..lora.served import ServedAdapters
from ..prefix.kv_store import PrefixBlocks
from ..runner_base import Advance, Emission, LiveSequence, RunnerBase
from ..sampling import greedy, guard_processors, make_request_processors, make_request_sampler, token_logprobs
from ..thread_streams import enter_mlx_thread, leave_mlx_thread
from .generator_join import JoinedRows
from .prefill import PrefillRow, PromptPrefill
from .prefill_budget import ChunkSizer
from .prefill_burst import burst_continues, sample_first
from .run_ahead import joined, kv_fits


@attrs.frozen
class PlanTiming:
    """What the chunk sizer needs of the last plan: when it started, and whether its decode
    time counts (rows decoded through it, and it prefilled no prompt tokens but a timed chunk)."""

    start: float
    timed: bool = False
    #: Seconds of its timed chunk (not part of the decode time the sizer keeps).
    chunk_s: float = 0.0


class BatchRunner(RunnerBase):
    """Executes step plans on one shared batch; each live sequence's handle is its row's uid."""

    kind = BATCHED

    #: One plan queued so the MLX thread starts the next step without waiting for Trio.
    plans_in_flight = 2
    max_tokens_per_step = 1

    @classmethod
    def results_per_plan(cls, engine) -> int:
        """A plan runs at most this many decode steps (run-ahead), each one's tokens a result
        (one result a plan when engine.hold_run_ahead_tokens holds them to its end)."""
        if engine.run_ahead_steps == 1 or engine.hold_run_ahead_tokens:
            return 1
        return max(engine.run_ahead_steps, engine.solo_run_ahead_steps)

    def __init__(self, cfg, *, request_waiting=None):
        super().__init__(cfg, request_waiting=request_waiting)
        self._generator: BatchGenerator | None = None
        self._request_ids: dict[int, RequestId] = {}  # BatchGenerator uid -> request
        #: uids past their prompt and first token: the generator's next response for them is a new token.
        self._decoding: set[int] = set()
        #: Rows that joined the decode batch with their last prompt token (worker/batched/generator_join.py).
        self._direct = JoinedRows()
        #: Prompts the runner prefills itself (engine.prefill_time_ratio set), else None.
        self._prefill: PromptPrefill | None = None
        #: The named adapters served over the base (model.adapters), else None.
        self._adapters: ServedAdapters | None = None
        self._sizer: ChunkSizer | None = None
        #: Caches of prompts whose prefill ended this step (all but the last token), by
        #: request: what :meth:`_prompt_ready` copies once they are in the generator.
        self._prompt_caches: dict[RequestId, list] = {}
        #: Rows sharing a cached prefix hold it once (worker/cascade/); set with the model.
        self._sharing: InBatchSharing | None = None
        self._last_plan: PlanTiming | None = None
        #: Whether this plan carries a timed chunk (its decode steps then run ahead too, for
        #: engine.chunk_run_ahead_ms), and the seconds it took.
        self._timed_chunk = False
        self._chunk_s = 0.0
        #: Seconds a plan's decode steps may take for another to join (engine.run_ahead_ms), and
        #: with one row in the batch (engine.solo_run_ahead_ms).
        self._run_ahead_window_s = cfg.engine.run_ahead_ms / 1000
        self._solo_window_s = cfg.engine.solo_run_ahead_ms / 1000
        #: Seconds of decode steps a plan carrying a timed prompt chunk may run (engine.chunk_run_ahead_ms).
        self._chunk_window_s = cfg.engine.chunk_run_ahead_ms / 1000
        #: Decode steps a plan may run, and with one row: 1 when sharded (every rank must run the same steps).
        self._run_ahead_steps = self._solo_steps = 1
        #: A run-ahead plan's tokens wait for its end (engine.hold_run_ahead_tokens), else each
        #: step's leave as it ends.
        self._hold_tokens = cfg.engine.hold_run_ahead_tokens
        #: First tokens this plan's prefill sampled itself (a burst, prefill_burst.py): no decode step runs.
        self._sampled_first: list[Emission] = []
        #: Tokens per row the KV budget keeps free beyond a step: the plans the scheduler may still send.
        shape = self.shape(cfg)
        self._kv_headroom = (shape.plans_in_flight + 1) * shape.max_tokens_per_step

    def _load(self) -> ModelInfo:
        enter_mlx_thread()
        model, info = load_for_serving(self._cfg.model, self._cfg.engine)
        self._start(model)
        assert self._sharing is not None
        return attrs.evolve(info, shared_prefix_in_batch=self._sharing.status)

    def _start(self, model) -> None:
        """The prefix store's side, the generator and the runner's own prefill, for ``model``
        (mlx-lm's, or a runner's adapter that looks like one)."""
        self._prefix = PrefixBlocks.from_config(model, self._cfg.cache)
        requested = self._cfg.cache.share_prefix_in_batch and self._shares_prefix_in_batch()
        self._sharing = InBatchSharing(
            model, self._prefix, requested=requested, min_tokens=self._cfg.cache.share_prefix_min_tokens
        )
        engine = self._cfg.engine
        self._generator = BatchGenerator(
            model,
            sampler=greedy,
            completion_batch_size=engine.completion_batch_size,
            prefill_batch_size=engine.prefill_batch_size,
            prefill_step_size=engine.prefill_step_size,
            stream=mx.new_stream(mx.default_device()),
        )
        self._adapters = ServedAdapters(model, self._cfg.model) if self._cfg.model.adapters else None
        if self._adapters is not None:  # each forward's rows apply their own adapter (worker/lora/)
            rows_model = self._adapters.for_generator(model, self._generator, self._adapter_of_uid)
            generator = self._generator
            generator.model = generator._generation_batch.model = generator._prompt_batch.model = rows_model
            model = self._adapters.for_prefill(model, self._adapter_of_prefill_head)
        if not sharding() and engine.run_ahead_steps > 1:  # 1: run-ahead off, for a lone row too
            self._run_ahead_steps, self._solo_steps = engine.run_ahead_steps, engine.solo_run_ahead_steps
        if engine.prefill_time_ratio is not None:
            self._prefill = PromptPrefill(model, self._generator.stream, on_boundary=self._prefix.at_boundary)
            chunk = min(engine.prefill_step_size, engine.prefill_step_size_decoding or engine.prefill_step_size)
            self._sizer = ChunkSizer(ratio=engine.prefill_time_ratio, max_tokens=chunk, timed=not sharding())

    def _shares_prefix_in_batch(self) -> bool:
        """Whether rows may hold a shared prefix once (worker/cascade/): a subclass whose rows enter the generator
        by another path (media rows, shards, speculation's rollbacks) keeps a copy per row unless it says so."""
        return type(self) is BatchRunner

    def _adapter_of_uid(self, uid: int) -> str | None:
        return self._live[self._request_ids[uid]].seq.params.adapter

    def _adapter_of_prefill_head(self) -> str | None:
        assert self._prefill is not None and self._prefill.head is not None
        return self._prefill.head.live.seq.params.adapter

    def _cache_for(self, sequence: LiveSequence) -> list | None:
        """The prefix store's cache for the sequence's hit (None: none). With named adapters, a
        hit recomputed from token ids runs the sequence's adapter, and a row without a hit gets an
        empty cache (mlx-lm's own prompt path, whose forwards are not the generation batch's,
        never runs)."""
        if self._adapters is None:
            return self._prefix.cache_for(sequence.seq)
        with self._adapters.applied(sequence.seq.params.adapter):
            return self._adapters.cache_or_new(self._prefix.cache_for(sequence.seq))

    def _insert(self, live: list[LiveSequence]) -> None:
        """New prompts wait for the runner's prefill when it has one and they have more than
        their last token to compute; the rest go to the generator at once."""
        caches = [self._cache_for(sequence) for sequence in live]
        if self._prefill is None:
            self._to_generator(live, caches, [sequence.seq.num_cached_tokens for sequence in live])
            return
        direct = []
        for sequence, cache in zip(live, caches, strict=True):
            if len(sequence.seq.prompt_token_ids) - sequence.seq.num_cached_tokens > 1:
                sequence.handle = self._prefill.add(sequence, cache, self._prefix.boundaries(sequence.seq))
            else:
                direct.append((sequence, cache))
        if direct:
            self._to_generator(
                [d[0] for d in direct], [d[1] for d in direct], [d[0].seq.num_cached_tokens for d in direct]
            )

    def _to_generator(
        self, live: list[LiveSequence], caches: list, in_cache: list[int], rows: list[tuple] | None = None
    ) -> None:
        """Insert rows into the generator: each one's first ``in_cache`` prompt tokens are in
        its cache (None: an empty one), the rest are its prompt there. A row with only its last
        prompt token left joins the decode batch directly (worker/batched/generator_join.py). ``rows``: their
        (sampler, processors, stop sequences) where already built, else built here."""
        assert self._generator is not None
        seqs = [sequence.seq for sequence in live]
        rows = rows or [self._row(sequence) for sequence in live]
        joining = [
            len(seq.prompt_token_ids) - n == 1 and cache is not None
            for seq, n, cache in zip(seqs, in_cache, caches, strict=True)
        ]
        caches = self._batch_caches(seqs, caches)
        uids: dict[int, int] = {}
        for join in (True, False):
            picked = [i for i, j in enumerate(joining) if j == join]
            if picked:
                args = ([seqs[i] for i in picked], [caches[i] for i in picked], [rows[i] for i in picked])
                if join:
                    uids.update(zip(picked, self._direct.join(self._generator, *args), strict=True))
                else:
                    uids.update(zip(picked, self._generator_insert(*args, [in_cache[i] for i in picked]), strict=True))
        for i, sequence in enumerate(live):
            sequence.handle = uids[i]
            self._request_ids[uids[i]] = sequence.request_id

    def _batch_caches(self, seqs: list, caches: list) -> list:
        """The caches rows enter the generator with: past the prefix they share with the batch, when sharing."""
        return self._sharing.rows(seqs, caches) if self._sharing is not None and self._sharing.active else caches

    def _generator_insert(self, seqs: list, caches: list, rows: list[tuple], in_cache: list[int]) -> list[int]:
        """mlx-lm's own insert: the rest of each prompt is processed as prompt segments."""
        assert self._generator is not None
        return self._generator.insert_segments(
            [self._segments(seq, n) for seq, n in zip(seqs, in_cache, strict=True)],
            caches=caches,
            all_tokens=[list(seq.prompt_token_ids[:n]) for seq, n in zip(seqs, in_cache, strict=True)],
            max_tokens=[seq.max_new_tokens for seq in seqs],
            samplers=[row[0] for row in rows],
            logits_processors=[row[1] for row in rows],
            stop_sequences=[row[2] for row in rows],
        )

    def _segments(self, seq, in_cache: int) -> list[list[int]]:
        """The prompt left for the generator: cut at the prefix store's block boundaries
        (mlx-lm ends a prefill chunk at each segment's end, where :meth:`_advance` snapshots)
        when it starts at the hit, else whole (the runner's own prefill stopped there)."""
        if in_cache == seq.num_cached_tokens:
            return self._prefix.prompt_segments(seq)
        return [list(seq.prompt_token_ids[in_cache:])]

    def _row(self, live: LiveSequence) -> tuple:
        """(sampler, logits processors, stop sequences) for one new row: the stop ids are
        the termination rule's (min_tokens keeps them from being sampled early)."""
        assert self._info is not None
        seq, params = live.seq, live.seq.params
        stop_ids = tuple(sorted(live.termination.stop_ids))
        return (
            make_request_sampler(params, self._info.vocab_size, seq.num_output_tokens),
            guard_processors(
                make_request_processors(params, stop_ids=stop_ids, generated=seq.output_token_ids),
                seq.request_id,
                self.failures,
            ),
            StopSequences([[t] for t in stop_ids] or None),
        )

    def _advance(self, live: list[LiveSequence]) -> Advance:
        """One chunk of the runner's own prefill (if any), then one ``BatchGenerator.next()``
        for the whole batch (``live`` is every row anyway), then the run-ahead steps.

        A step that ends a prompt gives that row's first token at once (worker/batched/generator_join.py),
        and the plan ends there, so the token is delivered at once (time to first token)."""
        assert self._generator is not None
        started = time.perf_counter()
        prompts_done = self._prefill_step()
        if self._sampled_first:  # more of the burst waits: its rows decode together once it is in
            emissions, self._sampled_first = self._sampled_first, []
            return Advance(emissions, prompts_done)
        self._generator.prefill_step_size = self._prefill_chunk()
        advance = self._generator_step(prompts_done)
        started += self._chunk_s  # the run-ahead bound is for decode steps: a timed chunk is not one
        steps, step_s = 1, time.perf_counter() - started
        max_steps, window_s = self._run_ahead_bounds()
        while max_steps > 1 and self._may_run_ahead(advance, live, steps):
            step_started = time.perf_counter()
            if steps >= max_steps or (step_started - started) + step_s > window_s:
                break
            advance = joined(advance if self._hold_tokens else self._publish(advance), self._generator_step([]))
            steps, step_s = steps + 1, time.perf_counter() - step_started
        return advance

    def _run_ahead_bounds(self) -> tuple[int, float]:
        """This plan's most decode steps and seconds: beside a timed prompt chunk its own bound
        (engine.chunk_run_ahead_ms); one row alone the solo window; else engine.run_ahead_steps / _ms."""
        if self._timed_chunk:
            return self._run_ahead_steps, self._chunk_window_s
        if len(self._request_ids) == 1:
            return self._solo_steps, self._solo_window_s
        return self._run_ahead_steps, self._run_ahead_window_s

    def _may_run_ahead(self, advance: Advance, live: list[LiveSequence], steps: int) -> bool:
        """Another decode step may join this plan: every row decodes (so no first token was just
        emitted), none ended, no queued plan starts a sequence, and the batch stays in the KV budget."""
        return (
            bool(self._request_ids)
            and len(self._decoding) == len(self._request_ids)
            and (self._prefill is None or self._prefill.head is None or self._timed_chunk)
            and not any(e.ended for e in advance.emissions)
            and not self.starts_waiting()
            and self._kv_fits(live, steps + 1)
        )

    def _kv_fits(self, live: list[LiveSequence], steps: int) -> bool:
        assert self._info is not None
        sharing = self._sharing
        shared = sharing.shared_tokens([s.request_id for s in live]) if sharing and sharing.active else None
        return kv_fits(live, steps, self._info.kv_budget_tokens, self._kv_headroom, shared)

    def _generator_step(self, prompts_done: list[RequestId]) -> Advance:
        """One ``BatchGenerator.next()``: its tokens, the first token of each row whose prompt it
        ended (worker/batched/generator_join.py), and the prompts it finished."""
        assert self._generator is not None
        prompt_progress, generated = self._generator.next()
        if self._sharing is not None:
            self._sharing.observe(self._generator._generation_batch.prompt_cache)
        self._sampled()
        first = [r.uid for r in prompt_progress if r.end_of_prompt]
        # All but the last prompt token are in the cache (mlx-lm makes that token its own
        # segment): where the prefix store checkpoints a prompt. An earlier segment's end is a
        # block boundary where it snapshots the sliding-window / recurrent layers.
        ends = [r for r in prompt_progress if r.end_of_segment and not r.end_of_prompt]
        prompts_done += [self._request_ids[r.uid] for r in ends if r.progress[0] == r.progress[1] - 1]
        for r in ends:
            if r.progress[0] < r.progress[1] - 1:
                self._prefix.at_boundary(self._request_ids[r.uid], self._generator.extract_cache([r.uid])[r.uid][0])
        emissions = []
        for response in generated:
            if self._direct.take_echo(response.uid):  # a joined row's last prompt token: its first token is next
                first.append(response.uid)
            elif self._direct.take_emitted(response.uid):  # the first token, emitted a step ago
                self._decoding.add(response.uid)
                if response.finish_reason is not None:
                    self._generator_ended_early(response.uid)
            else:
                emissions.append(self._emission(response))
        emissions += [
            Emission(self._request_ids[uid], (token,), (row,))
            for uid, token, row in self._direct.first_tokens(self._generator, first)
        ]
        return Advance(emissions, prompts_done)

    def _sampled(self) -> None:
        """Called once a generator step has sampled every row's next token (in
        ``GenerationBatch._next_tokens``), before anything reads them: a kind that must share
        them (the sharded runner) does it here."""

    def _emission(self, response) -> Emission:
        """A generator response as an emission; an ended row is let go (the generator has)."""
        ended = response.finish_reason is not None
        request_id = self._request_ids[response.uid]
        if ended:
            del self._request_ids[response.uid]
            self._decoding.discard(response.uid)
        return Emission(
            request_id, (response.token,), (response.logprobs,), ended=ended, final=response if ended else None
        )

    def _generator_ended_early(self, uid: int) -> None:
        """The generator ended a row on the first token the runner emitted, where the termination
        rule did not (they share max_tokens and stop ids, so this means a bug): the request fails."""
        request_id = self._request_ids.pop(uid)
        self._decoding.discard(uid)
        self.failures[request_id] = (
            "the runner ended the sequence after its first token, before its termination rule did"
        )

    def _prefill_step(self) -> list[RequestId]:
        """The runner's own prefill for this plan: a chunk of the oldest prompt, timed against
        the plan's decode steps while streams that had their first token before it arrived
        still run (a full chunk otherwise); a prompt whose prefill ends joins the generator."""
        self._prompt_caches.clear()
        self._timed_chunk, self._chunk_s = False, 0.0
        if self._prefill is None:
            return []
        decoding = bool(self._request_ids)
        self._observe_step(decoding)
        head = self._prefill.head
        if head is None:
            return []
        assert self._sizer is not None and self._last_plan is not None
        protect = decoding and any(rid in self._live for rid in head.live.seq.protects)
        budget = self._sizer.chunk() if protect else self._cfg.engine.prefill_step_size
        row = None if protect or head.left > budget else self._burst_row(head)
        tokens, done = self._prefill.step(budget, wait=protect, with_last=row is not None and not row[1])
        if protect and tokens:  # timed alone (a full chunk beside rows that are not protected is not)
            self._timed_chunk, self._chunk_s = True, self._prefill.last_chunk_s
            self._sizer.observe_chunk(self._chunk_s, tokens)
            self._last_plan = attrs.evolve(self._last_plan, chunk_s=self._chunk_s)
        elif tokens:
            self._last_plan = attrs.evolve(self._last_plan, timed=False)
        if done is None:
            return []
        if self._prefix.enabled:
            self._prompt_caches[done.live.request_id] = done.cache
        if done.first_logits is None:
            self._to_generator([done.live], [done.cache], [len(done.prompt) - 1], None if row is None else [row])
        else:
            self._join_sampled(done, row)
        return [done.live.request_id]

    def _burst_row(self, head: PrefillRow) -> tuple | None:
        """The generator row of a prompt whose chunk ends it in this plan while more of its burst waits, else None;
        it takes its first token from its own prefill (prefill_burst.py) unless it has logits processors."""
        assert self._prefill is not None
        if not self._prefix.layout.knows_position or not self._prefill.gives_first_logits:
            return None
        if not burst_continues(self._prefill, self._live, self._cfg.engine.prefill_step_size):
            return None
        return self._row(head.live)

    def _join_sampled(self, done: PrefillRow, row: tuple) -> None:
        """The prompt is in its cache, last token included: emit its first token, sampled from that forward, and
        join the generator with it as the token to feed next."""
        assert self._generator is not None
        with mx.stream(self._generator.stream):
            token, logprobs = sample_first(done, row[0])
        (cache,) = self._batch_caches([done.live.seq], [done.cache])
        uid = self._direct.join_sampled(self._generator, done.live.seq, cache, row, token, logprobs)
        done.live.handle = uid
        self._request_ids[uid] = done.live.request_id
        self._sampled_first.append(Emission(done.live.request_id, (int(token.item()),), (logprobs,)))

    def _observe_step(self, decoding: bool) -> None:
        """Time the plan that just ended (start to start) for the chunk sizer, when rows
        decoded through it and still do."""
        assert self._sizer is not None
        now = time.perf_counter()
        last = self._last_plan
        if last is not None and decoding and last.timed:
            self._sizer.observe_plan(now - last.start - last.chunk_s)
        self._last_plan = PlanTiming(now, timed=decoding)

    def _prefill_chunk(self) -> int:
        """Prompt tokens per prefilling row in the next step: smaller while rows decode."""
        engine = self._cfg.engine
        if self._decoding and engine.prefill_step_size_decoding is not None:
            return min(engine.prefill_step_size, engine.prefill_step_size_decoding)
        return engine.prefill_step_size

    def _remove(self, live: list[LiveSequence]) -> None:
        assert self._generator is not None
        if self._prefill is not None:
            self._prefill.remove([sequence.handle for sequence in live if isinstance(sequence.handle, PrefillRow)])
        uids = [sequence.handle for sequence in live if sequence.handle in self._request_ids]
        if uids:
            self._generator.remove(uids)
            self._direct.forget(uids)
        for uid in uids:
            del self._request_ids[uid]
            self._decoding.discard(uid)

    def _prompt_ready(self, live: LiveSequence) -> KVReady | None:
        """The prompt is processed: copy its new full blocks for the prefix store."""
        assert self._generator is not None
        if not self._prefix.enabled:
            return None
        seq = live.seq
        cache = self._prompt_caches.pop(seq.request_id, None)
        if cache is None:
            cache, _tokens = self._generator.extract_cache([live.handle])[live.handle]
        first_block = seq.num_cached_tokens // self._prefix.block_size
        # all but the last prompt token are in the cache (a recurrent-only cache cannot say)
        position = len(seq.prompt_token_ids) - 1
        return self._prefix.ready(seq.request_id, seq.prompt_token_ids, cache, first_block, position=position)

    def _finished_ready(self, live: LiveSequence, emission: Emission) -> KVReady | None:
        """A sequence finished: its prompt + output blocks, for the next turn of a chat."""
        response = emission.final
        if not self._cfg.cache.store_generated or response is None or response.prompt_cache is None:
            return None
        first_block = len(live.seq.prompt_token_ids) // self._prefix.block_size
        return self._prefix.ready(live.request_id, tuple(response.all_tokens), response.prompt_cache, first_block)

    def _logprobs(self, rows: Sequence[mx.array], tokens: Sequence[int], num_tops: Sequence[int]) -> list[TokenLogprob]:
        return token_logprobs(rows, tokens, num_tops)

    @property
    def compute_stream(self) -> mx.Stream | None:
        """The stream the model runs on (a distributed runner orders its collectives on it)."""
        return self._generator.stream if self._generator is not None else None

    def _memory(self, *, idle: bool) -> tuple[int, int, int]:
        return mlx_memory(idle=idle)

    def _close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
        self._request_ids.clear()
        self._decoding.clear()
        self._prompt_caches.clear()
        self._prefill = None
        mx.clear_cache()
        leave_mlx_thread()
