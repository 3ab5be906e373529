"""A model check of the two tiers together: the block pool with a disk budget, a real disk tier
over a temporary directory, and a stand-in executor that holds each entry's arrays.

Random traffic (requests served with or without a tail checkpoint and released, evictions that
spill, restarts over the same directory with a new budget, damaged files, clears) runs against
simple models: which blocks and tails are in memory, the pool's LRU of hashes only on disk
(bytes), and the tier's LRU of files. After every rule the real state must match them, and every
array a hit is built from must be the one its entry's tokens name, whether it stayed in memory,
came back from a file or was recomputed: a damaged or foreign file is a miss (one WARNING,
deleted), never a wrong hit.

Tails (a checkpoint at a position inside a block) live in memory only: a hit may end in one, an
evicted block takes the tails under it along (nothing spills them), and a block read back from
disk comes back without them, so a repeat after a spill ends its hit at the block boundary.

A block's arrays are made from its chained hash and a tail's from its tokens (no model needed):
a file read back under another block's name, or an entry served for the wrong tokens, shows as
different arrays.

This is the machine for a model whose every layer is ``kv``; the hooks marked "layout" are what
a model with sliding-window or recurrent layers changes (tests/prefix/test_hybrid_machine.py).
The tests: tests/prefix/test_disk_tier_machine.py and test_hybrid_machine.py.
"""

from __future__ import annotations

import collections
import logging
import pathlib
import shutil
import tempfile

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from two_tier_parts import (
    DAMAGE,
    MODEL,
    LayoutModel,
    WarningCounter,
    arrays_of,
    prompts,
    requests,
    salts,
    same,
    tail_backs,
    tail_name,
)

from vllm_mlx_trio.actors.prefix.cache_manager import remember_disk_blocks
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.prefix.block_pool import DISK_BLOCK_SUFFIX, BlockPool, Budget
from vllm_mlx_trio.core.prefix.child_index import common_length
from vllm_mlx_trio.core.prefix.media_keys import chain_hashes
from vllm_mlx_trio.messages import NewSequence
from vllm_mlx_trio.worker.prefix.disk_tier import DiskTier, host_nbytes
from vllm_mlx_trio.worker.prefix.disk_tier_file import encode, encoded_size, read_metadata, to_host
from vllm_mlx_trio.worker.prefix.kv_store import PrefixBlocks

PARAMS = SamplingParams()


class TwoTierMachine(RuleBasedStateMachine):
    """The pool, the disk tier and an executor's store, against models of what each holds."""

    #: layout: every layer is ``kv``: a hit may end after any full block or inside any entry,
    #: and full blocks go to disk (written through when made, spilled when evicted).
    blocks_end_hits = True
    #: The model's cache layers; the executor's real ``PrefixBlocks`` reads its layout from them
    #: and says what its commits say (``KVReady.blocks_end_hits``) and where it snapshots.
    kinds: tuple[str, ...] = ("kv", "kv")

    @initialize(block_size=st.integers(2, 4), max_blocks=st.integers(0, 10), disk_files=st.integers(1, 6))
    def setup(self, block_size, max_blocks, disk_files):
        self._setup(block_size, max_blocks, disk_files)

    def _setup(self, block_size, max_blocks, disk_files, snapshot_blocks=0):
        self.executor = PrefixBlocks(LayoutModel(self.kinds), block_size, enabled=True, snapshot_blocks=snapshot_blocks)
        assert self.executor.layout.blocks_end_hits == self.blocks_end_hits, "the layout's own verdict"
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="two-tier-"))
        self.bs, self.max_blocks = block_size, max_blocks
        host = to_host(arrays_of(bytes(16)))
        self.file_size = encoded_size(host, model_id=MODEL, key_hex=bytes(16).hex())
        self.block_nbytes = host_nbytes(host)
        self.warnings = WarningCounter()
        logging.getLogger("vllm_mlx_trio.worker.prefix.disk_tier").addHandler(self.warnings)
        self.expected_warnings = 0
        self.tier: DiskTier | None = None
        self._open(disk_files)
        self.files: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # the tier's LRU
        self.damaged: dict[bytes, bool] = {}  # hash -> whether the tier's scan finds it

    def teardown(self):
        if getattr(self, "tier", None) is not None:
            self.tier.close()
            logging.getLogger("vllm_mlx_trio.worker.prefix.disk_tier").removeHandler(self.warnings)
            shutil.rmtree(self.dir, ignore_errors=True)

    def _open(self, disk_files: int) -> None:
        """A new tier, then a new pool over the same directory (as a server starts)."""
        self.disk_budget = disk_files * self.file_size
        self.tier = DiskTier(self.dir, self.disk_budget, MODEL)
        self.pool = BlockPool(self.bs, self._budget(), disk_budget=self.disk_budget)
        remember_disk_blocks(self.pool, self.dir)
        self.mem: dict[bytes, int] = {}  # hash -> id of the blocks in memory
        self.tails: dict[tuple, int] = {}  # (salt, the tokens up to its end) -> id of the tails
        self.content: dict[int, tuple] = {}  # id -> (salt, the tokens up to its end), blocks and tails
        self.names: dict[int, bytes] = {}  # id -> what its arrays spell: a block's hash, a tail's name
        self.nbytes: dict[int, int] = {}  # id -> the size the pool has for it
        self.leases: dict[str, set[int]] = collections.defaultdict(set)
        self.store: dict[int, list] = {}  # the executor's arrays
        self.on_disk: collections.OrderedDict[bytes, int] = collections.OrderedDict()  # the pool's LRU

    # -- the models' operations --------------------------------------------------------

    def _pool_remembers(self, h: bytes, nbytes: int) -> bool:
        if nbytes > self.disk_budget:
            return False
        self.on_disk.pop(h, None)
        self.on_disk[h] = nbytes
        while sum(self.on_disk.values()) > self.disk_budget:
            self.on_disk.popitem(last=False)
        return True

    def _tier_spills(self, h: bytes) -> bool:
        if h in self.files:
            self.files.move_to_end(h)
            return False
        self.files[h] = None
        while len(self.files) * self.file_size > self.disk_budget:
            forgotten, _ = self.files.popitem(last=False)
            self.damaged.pop(forgotten, None)  # deleted unread: no warning
        return True

    def _spill(self, expected: list[tuple[int, bytes]]) -> None:
        """The executor writes what the pool spilled (before dropping evicted blocks)."""
        assert list(self.pool.take_spilled()) == expected
        for block_id, h in expected:
            assert self.tier.spill(h, self.store[block_id]) == self._tier_spills(h)

    def _chain(self, tokens, salt, num_blocks) -> list[bytes]:
        return list(chain_hashes(tokens, salt, (), self.bs, num_blocks))

    def _add(self, block_id: int, salt: tuple, covered: tuple, name: bytes, *, is_tail: bool) -> None:
        """An entry now in memory (its arrays stored by the caller)."""
        self.content[block_id] = (salt, covered)
        self.names[block_id] = name
        if is_tail:
            self.tails[(salt, covered)] = block_id
        else:
            self.mem[name] = block_id

    def _is_tail(self, block_id: int) -> bool:
        """Whether an entry in memory is a tail (an empty tail covers what its block does)."""
        return self.tails.get(self.content[block_id]) == block_id

    def _forget(self, block_id: int) -> None:
        """An entry gone from memory (its arrays stay until the caller drops them)."""
        is_tail = self._is_tail(block_id)
        salt, covered = self.content.pop(block_id)
        name = self.names.pop(block_id)
        self.nbytes.pop(block_id, None)
        if is_tail:
            del self.tails[(salt, covered)]
        else:
            del self.mem[name]

    def _tails_under(self, block_id: int) -> set[int]:
        """The tails hanging right after a full block (dropped with it): those from its end
        (an empty one there, a boundary snapshot) to before the next block's end."""
        salt, covered = self.content[block_id]
        end = len(covered)
        return {
            tail_id
            for (tail_salt, tail), tail_id in self.tails.items()
            if tail_salt == salt and end <= len(tail) < end + self.bs and tail[:end] == covered
        }

    # -- rules ---------------------------------------------------------------------------

    served = Bundle("served")

    @rule(target=served, request=requests, tokens=prompts, salt=salts, tail_back=tail_backs, finish=st.booleans())
    def serve(self, request, tokens, salt, tail_back, finish):
        """A request: lookup, read back or recompute the hit, commit the prompt's blocks (and
        maybe a tail), and maybe finish (its leases end)."""
        self._serve(request, tokens, salt, tail_back, finish)
        return (tokens, salt)

    @rule(request=requests, prompt=served, tail_back=tail_backs, finish=st.booleans())
    def serve_again(self, request, prompt, tail_back, finish):
        """A prompt served before (maybe before a restart, an eviction or a clear)."""
        self._serve(request, *prompt, tail_back, finish)

    @rule(
        target=served,
        first=requests,
        second=requests,
        tokens=prompts,
        salt=salts,
        first_tail_back=st.sampled_from([0, 1]),
        tail_back=tail_backs,
    )
    def serve_a_repeat(self, first, second, tokens, salt, first_tail_back, tail_back):
        """A prompt with a tail at its end or one token before, then at once the same prompt
        again (a retry, an agent re-sending): the second hit ends in that tail (all-KV: in part
        when it holds the last token, and not on a block boundary, where the block ends it;
        hybrid: only when it leaves the last token out)."""
        self._serve(first, tokens, salt, first_tail_back, False)
        self._serve(second, tokens, salt, tail_back, True)
        return (tokens, salt)

    def _serve(self, request, tokens, salt, tail_back, finish):
        eligible = max(0, (len(tokens) - 1) // self.bs)
        next_id = self.pool.next_id
        hit = self.pool.lookup(request, tokens, salt)
        run, restored = [], []
        for index, h in enumerate(self._chain(tokens, salt, eligible)):
            if h in self.mem:
                run.append(self.mem[h])
            elif h in self.on_disk:  # back in memory under a new id, read from disk
                block_id = next_id + len(restored)
                self.nbytes[block_id] = self.on_disk.pop(h)
                self._add(block_id, salt, tokens[: (index + 1) * self.bs], h, is_tail=False)
                restored.append((block_id, h))
                run.append(block_id)
            else:
                break
        assert hit.num_cached_tokens == self._expected_hit(tokens, salt, len(run))
        depth = hit.num_cached_tokens // self.bs  # the run's blocks it uses, then maybe the entry it ends in
        assert list(hit.block_ids[:depth]) == run[:depth] and len(hit.block_ids) - depth in (0, 1)
        for i, block_id in enumerate(hit.block_ids):
            entry_salt, covered = self.content[block_id]
            assert entry_salt == salt and covered[: i * self.bs] == tokens[: i * self.bs]
        self._check_hit_end(hit, tokens)
        assert list(hit.disk_blocks) == restored
        ends_in_tail = bool(hit.block_ids) and self._is_tail(hit.block_ids[-1])
        event(f"served: {'hit through disk' if restored else 'hit' if hit.block_ids else 'miss'}")
        event(f"served: {'ends in a tail' + (' after disk' if restored else '') if ends_in_tail else 'no tail'}")
        self.leases[request].update(hit.block_ids)
        self._read_back(restored)
        for block_id in hit.block_ids:
            assert same(self.store[block_id], self.names[block_id]), "a hit built from another entry's arrays"
        tail_at = self._tail_at(tokens, tail_back)
        seq = NewSequence(
            request_id=request, prompt_token_ids=tokens, params=PARAMS, num_cached_tokens=hit.num_cached_tokens
        )
        boundaries = self.executor.boundaries(seq)  # where the executor's prefill snapshots
        assert boundaries == self._boundaries(tokens, hit.num_cached_tokens)
        self._commit(request, tokens, salt, tail_at, boundaries)
        if finish:
            self.release([request])
        self.evict()  # as the cache manager does after a commit

    # -- layout: where a hit ends and where a commit checkpoints --------------------------

    def _check_hit_end(self, hit, tokens) -> None:
        """The entry a hit ends in may be used in part (a KV prefix of any length is exact)."""
        if hit.block_ids:
            assert self.content[hit.block_ids[-1]][1][: hit.num_cached_tokens] == tokens[: hit.num_cached_tokens]

    def _budget(self) -> Budget:
        return Budget(max_blocks=self.max_blocks)

    def _over_budget(self, alive: set[int]) -> bool:
        return len(alive) > self.max_blocks

    def _entry_nbytes(self, is_tail: bool) -> int:
        """What the executor reports for a new block or tail."""
        return self.block_nbytes

    def _tail_at(self, tokens, tail_back: int | None) -> int | None:
        """Where a commit's runner checkpoints: ``tail_back`` tokens before the prompt's end."""
        return None if tail_back is None or len(tokens) - tail_back < 1 else len(tokens) - tail_back

    def _boundaries(self, tokens, num_cached: int) -> tuple[int, ...]:
        """Where the prefill snapshotted its window and state layers: nowhere (there are none)."""
        return ()

    def _checkpoints(self, tokens, tail_at: int | None, boundaries: tuple[int, ...]) -> list[int]:
        """The positions a commit puts a tail at: ``tail_at`` unless no tail is needed there
        (on a block boundary the block ends a hit)."""
        return [tail_at] if tail_at is not None and tail_at % self.bs else []

    def _expected_hit(self, tokens, salt, run: int) -> int:
        """The full blocks of the run, then the most tokens a block or tail in memory right
        after them shares with the prompt, never past ``len(tokens) - 1``."""
        limit = len(tokens) - 1
        best = 0
        for depth in range(run + 1):
            base = depth * self.bs
            best = max(best, base)
            for entry_salt, covered in self.content.values():
                child = base < len(covered) <= base + self.bs
                if entry_salt == salt and child and covered[:base] == tokens[:base]:
                    best = max(best, base + min(common_length(covered[base:], tokens[base:]), limit - base))
        return best

    def _read_back(self, restored: list[tuple[int, bytes]]) -> None:
        """As ``PrefixBlocks``: read spilled blocks back in order; from the first the tier
        cannot give on, recompute (here: the arrays their hash names)."""
        for index, (block_id, h) in enumerate(restored):
            block = self.tier.load(h)
            good = h in self.files and h not in self.damaged
            assert (block is not None) == good, (h.hex(), good)
            event(f"read back: {'good' if good else 'damaged' if h in self.damaged else 'gone'}")
            if h in self.damaged:  # a miss, one WARNING, and the file goes
                del self.files[h], self.damaged[h]
                self.expected_warnings += 1
            if block is None:
                for later_id, later_h in restored[index:]:
                    self.store[later_id] = arrays_of(later_h)
                return
            self.files.move_to_end(h)
            self.store[block_id] = block

    def _commit(self, request, tokens, salt, tail_at, boundaries) -> None:
        created = self.pool.commit(
            request,
            tokens,
            salt,
            tail_at=tail_at,
            blocks_end_hits=self.executor.layout.blocks_end_hits,
            boundary_at=boundaries,
        )
        chain = self._chain(tokens, salt, len(tokens) // self.bs)
        blocks = [b for b in created if not b.is_tail]
        assert [b.block_index for b in blocks] == [i for i, h in enumerate(chain) if h not in self.mem]
        tails = [(salt, tokens[:at]) for at in self._checkpoints(tokens, tail_at, boundaries)]
        made = list(dict.fromkeys(tail for tail in tails if tail not in self.tails))  # in order, once each
        new_tails = [b for b in created if b.is_tail]
        assert list(created[len(blocks) :]) == new_tails, "a commit's tails come after its blocks"
        at = [len(covered) for _, covered in made]
        assert [(b.token_start, b.token_end) for b in new_tails] == [(end - end % self.bs, end) for end in at]
        for b in blocks:
            h = chain[b.block_index]
            self._add(b.block_id, salt, tokens[: b.token_end], h, is_tail=False)
            self.on_disk.pop(h, None)  # in memory again
        for b, tail in zip(new_tails, made, strict=True):
            self._add(b.block_id, *tail, tail_name(*tail), is_tail=True)
        for b in created:
            self.store[b.block_id] = arrays_of(self.names[b.block_id])
            self.nbytes[b.block_id] = self._entry_nbytes(b.is_tail)
            self.pool.set_nbytes(b.block_id, self.nbytes[b.block_id])
        self.leases[request].update(self.mem[h] for h in chain)
        self.leases[request].update(self.tails[tail] for tail in tails)
        # written through to disk when every layer is kv; tails never
        self._spill([(b.block_id, chain[b.block_index]) for b in blocks if self.blocks_end_hits])

    @rule(released=st.lists(requests, min_size=1, max_size=3))
    def release(self, released):
        self.pool.release(released)
        for request in released:
            self.leases.pop(request, None)

    def _expected_evictions(self) -> list[tuple[int, set[int]]]:
        """Least recently used first while over the budget (blocks and tails both count): each
        entry evicted, with the tails a block takes along."""
        alive = set(self.content)
        groups = []
        for block_id in self.pool.free_queue():
            if not self._over_budget(alive):
                break
            if block_id in alive:
                along = set() if self._is_tail(block_id) else self._tails_under(block_id) & alive
                groups.append((block_id, along))
                alive -= {block_id, *along}
        return groups

    @rule()
    def evict(self):
        groups = self._expected_evictions()
        evicted = list(self.pool.evict_over_budget())
        at = 0
        for block_id, along in groups:  # the entry, then its tails in any order
            assert evicted[at] == block_id and set(evicted[at + 1 : at + 1 + len(along)]) == along
            at += 1 + len(along)
        assert at == len(evicted)
        spilled = []
        for block_id, along in groups:
            spills = self.blocks_end_hits and not self._is_tail(block_id)  # a block that can end a hit
            h, nbytes = self.names[block_id], self.nbytes[block_id]
            for dropped in (*along, block_id):
                self._forget(dropped)
            if spills and self._pool_remembers(h, nbytes):
                spilled.append((block_id, h))
        self._spill(spilled)
        for block_id in evicted:
            del self.store[block_id]
        event(f"evict: {'spilled' if spilled else 'dropped' if evicted else 'nothing'}")

    @rule(disk_files=st.integers(1, 6))
    def restart(self, disk_files):
        """A new tier and pool over the same directory, maybe with another budget: what was on
        disk is found again, oldest modification time first, trimmed to the budget."""
        self.tier.close()
        for h, found_at_open in list(self.damaged.items()):
            if found_at_open:  # the tier's scan deletes it, with one WARNING
                del self.files[h], self.damaged[h]
                self.expected_warnings += 1
        stats = {h: (self.dir / f"{h.hex()}{DISK_BLOCK_SUFFIX}").stat().st_mtime_ns for h in self.files}
        order = sorted(self.files, key=lambda h: (stats[h], h.hex()))
        self.files = collections.OrderedDict((h, None) for h in order[max(0, len(order) - disk_files) :])
        for h in set(self.damaged) - set(self.files):  # trimmed unread
            del self.damaged[h]
        self._open(disk_files)
        for h in self.files:
            self._pool_remembers(h, self.file_size)
        event(f"restart: {'blocks on disk' if self.files else 'empty'}")

    @rule(data=st.data(), damage=st.sampled_from(sorted(DAMAGE)), then_restart=st.booleans())
    def damage_a_file(self, data, damage, then_restart):
        """Damage one good file, then maybe restart (the tier's scan meets it first)."""
        self.tier.flush()
        if not set(self.files) - set(self.damaged):
            return
        h = data.draw(st.sampled_from(sorted(set(self.files) - set(self.damaged))))
        path = self.dir / f"{h.hex()}{DISK_BLOCK_SUFFIX}"
        raw = path.read_bytes()
        if damage == "truncated":
            path.write_bytes(raw[: data.draw(st.integers(0, len(raw) - 1))])
        elif damage == "corrupted-data":
            at = data.draw(st.integers(read_metadata(raw)[1], len(raw) - 1))
            path.write_bytes(raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :])
        elif damage == "foreign-model":
            path.write_bytes(encode(to_host(arrays_of(h)), model_id="model-b", key_hex=h.hex()))
        elif damage == "another-block":
            other = bytes(reversed(h))
            path.write_bytes(encode(to_host(arrays_of(other)), model_id=MODEL, key_hex=other.hex()))
        else:
            path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
        self.damaged[h] = DAMAGE[damage]
        if then_restart:
            self.restart(len(self.files))

    @rule()
    def clear(self):
        """DELETE /v1/cache: every unleased block and every file go; leased blocks stay."""
        leased = set().union(*self.leases.values())
        dropped = self.pool.clear()
        assert set(dropped) == set(self.content) - leased
        self.tier.clear()
        for block_id in dropped:
            self._forget(block_id)
            del self.store[block_id]
        self.on_disk.clear()
        self.files.clear()
        self.damaged.clear()

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def pool_matches_its_model(self):
        self.pool.check_invariants()
        stats = self.pool.stats()
        assert (stats.num_blocks, stats.num_tails) == (len(self.mem) + len(self.tails), len(self.tails))
        assert all(self.pool.block_info(block_id).block_hash == h for h, block_id in self.mem.items())
        assert all(self.pool.is_tail(block_id) for block_id in self.tails.values())
        assert self.pool.num_on_disk == len(self.on_disk)
        assert self.pool.disk_bytes == sum(self.on_disk.values()) <= self.disk_budget
        counts = collections.Counter(b for lease in self.leases.values() for b in lease)
        assert all(self.pool.ref_count(block_id) == counts[block_id] for block_id in self.content)

    @invariant()
    def every_entry_hangs_under_a_block_in_memory(self):
        """No entry is stranded: the full block it hangs under is in memory and, when both are
        free, behind it in the free queue (a lease of an entry leases that block too, and a
        release queues the deepest first), so evictions go from the leaves."""
        blocks = {self.content[block_id]: block_id for block_id in self.mem.values()}
        order = {block_id: at for at, block_id in enumerate(self.pool.free_queue())}
        for block_id, (salt, covered) in self.content.items():
            depth = len(covered) // self.bs - (not self._is_tail(block_id))
            if depth:
                parent = blocks.get((salt, covered[: depth * self.bs]))
                assert parent is not None, "an entry whose block is gone"
                assert block_id not in order or order.get(parent, len(order)) > order[block_id], (
                    "a block before its child"
                )

    @invariant()
    def executor_holds_exactly_the_pools_entries(self):
        assert set(self.store) == set(self.content) == set(self.names)
        assert all(same(self.store[block_id], name) for block_id, name in self.names.items())

    @invariant()
    def tier_matches_its_model(self):
        self.tier.flush()
        assert len(self.tier) == len(self.files) and all(h in self.tier for h in self.files)
        names = {p.name for p in self.dir.iterdir()}
        assert names == {f"{h.hex()}{DISK_BLOCK_SUFFIX}" for h in self.files}, "a file the model does not know"
        good = [h for h in self.files if h not in self.damaged]
        assert all((self.dir / f"{h.hex()}{DISK_BLOCK_SUFFIX}").stat().st_size == self.file_size for h in good)
        assert len(self.files) * self.file_size <= self.disk_budget
        assert self.tier.queued_bytes == 0
        assert len(self.warnings.names) == self.expected_warnings
