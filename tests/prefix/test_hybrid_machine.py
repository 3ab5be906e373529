"""The two-tier state machine (tests/prefix/two_tier_machine.py) for a model with sliding-window or
recurrent layers beside its ``kv`` ones (gemma3_text, gpt_oss, qwen3_next, lfm2), whose commits
say ``blocks_end_hits=False``.

Its full blocks carry only the ``kv`` layers; the window and state layers live only in tails
(checkpoints). So a hit ends only at a tail's exact end, a tail that the prompt starts with and
that leaves its last token to compute: never inside a tail, never after a full block with no
tail there. A commit puts a tail at its ``tail_at`` (even on a block boundary: an empty tail)
and an empty one at each boundary where the prefill snapshotted those layers
(``cache.state_snapshot_blocks``, ``KVReady.boundary_at``: every N blocks after the hit, before
the prompt's last token).

Nothing of such a model goes to disk: its blocks cannot end a hit, so the pool neither writes
them through nor spills them, and a block read back from disk would come back without the tail
a hit must end in. The tier stays empty; the pool remembers no hash; a lookup never extends
through disk. The danger is a directory that holds blocks under the same names from another
model (an all-KV sibling with the same tokenizer and block size names its blocks by the same
chained hashes): the tier's open must delete those as foreign (one WARNING each), or the pool
would read them back as blocks that end a hit (``foreign_blocks_then_restart``).

A pure-recurrent model (mamba, mamba2: every layer ``state``) is the same to the pool (it is
told ``blocks_end_hits=False`` and nothing of the layers); only where its runner can checkpoint
differs: at the boundaries the store cut the prefill at and at the prompt less its last token,
never at a finish (its cache does not say where it stands). ``PureStateMachine`` draws only
those commits, with blocks that hold nothing (0 bytes) under a byte budget.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule
from two_tier_machine import TwoTierMachine
from two_tier_parts import MODEL, arrays_of

from vllm_mlx_trio.core.prefix.block_pool import DISK_BLOCK_SUFFIX, Budget
from vllm_mlx_trio.worker.prefix.disk_tier_file import encode, to_host

#: The all-KV sibling whose block files share this model's names (see the module's docstring).
SIBLING = "model-all-kv"
assert SIBLING != MODEL


class HybridMachine(TwoTierMachine):
    """Both tiers for a model whose hits end only at checkpoints."""

    blocks_end_hits = False
    kinds = ("kv", "window", "state")
    #: gemma3_text and gpt_oss (sliding window), qwen3_next and lfm2 (linear attention, conv)
    KINDS = (("kv", "window"), ("kv", "state"), ("kv", "window", "state"))

    @initialize(
        block_size=st.integers(2, 4),
        max_blocks=st.integers(0, 10),
        disk_files=st.integers(1, 6),
        snapshot_blocks=st.integers(0, 2),
        kinds=st.sampled_from(KINDS),
    )
    def setup(self, block_size, max_blocks, disk_files, snapshot_blocks, kinds):
        #: Tokens between the prefill's snapshots of the window and state layers (0: none).
        self.snapshot_every = snapshot_blocks * block_size
        self.kinds = kinds
        self._setup(block_size, max_blocks, disk_files, snapshot_blocks)

    # -- layout ----------------------------------------------------------------------------

    def _check_hit_end(self, hit, tokens) -> None:
        """A hit ends in a tail, at its exact end (never in part), or is a miss."""
        if not hit.block_ids:
            assert hit.num_cached_tokens == 0
            return
        last = hit.block_ids[-1]
        assert self._is_tail(last), "a hybrid hit ended after a bare full block"
        assert len(self.content[last][1]) == hit.num_cached_tokens, "a hybrid hit used a tail in part"
        assert len(hit.block_ids) == 1 + hit.num_cached_tokens // self.bs
        cached = hit.num_cached_tokens
        event(f"hybrid hit: ends {'on a block boundary (empty tail)' if cached % self.bs == 0 else 'inside a block'}")
        event(f"hybrid hit: {'a repeat: all but its last token' if cached == len(tokens) - 1 else 'shorter'}")

    def _boundaries(self, tokens, num_cached: int) -> tuple[int, ...]:
        """As ``PrefixBlocks.boundaries``: every ``snapshot_every`` tokens after the hit, before
        the prompt's last token."""
        every = self.snapshot_every
        if not every:
            return ()
        return tuple(range(num_cached // every * every + every, len(tokens) - 1, every))

    def _checkpoints(self, tokens, tail_at: int | None, boundaries: tuple[int, ...]) -> list[int]:
        """The boundary snapshots, then ``tail_at`` (empty tails too: a block ends no hit)."""
        at = [*boundaries, *([] if tail_at is None else [tail_at])]
        return [end for end in at if 0 < end <= len(tokens)]

    def _expected_hit(self, tokens, salt, run: int) -> int:
        """The end of the longest tail the prompt starts with, whose full blocks are all in the
        run, short of the prompt's last token."""
        limit = len(tokens) - 1
        ends = [
            len(covered)
            for tail_salt, covered in self.tails
            if tail_salt == salt
            and len(covered) <= limit
            and len(covered) // self.bs <= run
            and tokens[: len(covered)] == covered
        ]
        return max(ends, default=0)

    # -- rules -----------------------------------------------------------------------------

    @rule(prompt=TwoTierMachine.served, disk_files=st.integers(1, 6))
    def foreign_blocks_then_restart(self, prompt, disk_files):
        """The all-KV sibling left its blocks of this prompt in the directory, under the very
        names this model's blocks have; the next start's tier deletes each as foreign."""
        tokens, salt = prompt
        self.tier.flush()
        for h in self._chain(tokens, salt, len(tokens) // self.bs):
            if h not in self.files:
                path = self.dir / f"{h.hex()}{DISK_BLOCK_SUFFIX}"
                path.write_bytes(encode(to_host(arrays_of(h)), model_id=SIBLING, key_hex=h.hex()))
                self.files[h] = None
                self.damaged[h] = True  # found at open
        event(f"foreign blocks: {len(self.damaged)}")
        self.restart(disk_files)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def nothing_goes_to_disk(self):
        assert self.pool.num_on_disk == 0 and not self.on_disk
        assert not (set(self.files) - set(self.damaged)), "a block of this model on disk"


class PureStateMachine(HybridMachine):
    """Both tiers for a model with recurrent layers only (mamba, mamba2): its blocks hold no
    arrays (0 bytes), its tails the state, under a byte budget; every commit is a prompt's, with
    its tail at all but the prompt's last token (a finish commits nothing: no runner states the
    position of such a cache there)."""

    kinds = ("state", "state")

    @initialize(
        block_size=st.integers(2, 4),
        max_tails=st.integers(0, 5),
        disk_files=st.integers(1, 6),
        snapshot_blocks=st.integers(0, 2),
    )
    def setup(self, block_size, max_tails, disk_files, snapshot_blocks):
        self.snapshot_every = snapshot_blocks * block_size
        self.max_tails = max_tails
        self._setup(block_size, None, disk_files, snapshot_blocks)

    def _budget(self) -> Budget:
        return Budget(max_bytes=self.max_tails * self.block_nbytes)

    def _over_budget(self, alive: set[int]) -> bool:
        return sum(self.nbytes[block_id] for block_id in alive) > self.max_tails * self.block_nbytes

    def _entry_nbytes(self, is_tail: bool) -> int:
        return self.block_nbytes if is_tail else 0

    def _tail_at(self, tokens, tail_back: int | None) -> int | None:
        return len(tokens) - 1 if len(tokens) > 1 else None


TestHybridMachine = HybridMachine.TestCase
TestHybridMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None, database=None)

TestPureStateMachine = PureStateMachine.TestCase
TestPureStateMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None, database=None)
