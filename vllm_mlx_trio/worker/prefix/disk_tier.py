"""The prefix cache's disk tier: full blocks spilled from memory, one safetensors file each.

A block is named by its chained hash (``<hash hex>.safetensors`` in ``directory``), so the
same prompt prefix under the same model finds it again, in this process or after a restart:
the index (hash -> file size, least recently used first) is rebuilt from the directory when
the tier opens, oldest modification time first. The tier holds at most ``max_bytes`` of
files; a spill or an open over that deletes the least recently used ones.

Writes are off the MLX thread's critical path: :meth:`DiskTier.spill` copies the arrays to
host memory and queues them; one writer thread encodes, writes (to a temporary name, then
renamed, so a crash leaves no half file under a block's name) and deletes, in order. A queued
block holds its arrays until it is written, so the queue is bounded in bytes
(``WRITER_QUEUE_BYTES``) as well as in blocks: a spill that finds it full is skipped and
counted (the block is simply not on disk). :meth:`load` serves a
block still queued from memory and otherwise reads its file; a file that is truncated,
corrupted or from another model or format version is a miss: one WARNING, and it is deleted.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import os
import pathlib
import queue
import threading
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from ...core.prefix.block_pool import DISK_BLOCK_SUFFIX as SUFFIX
from .disk_tier_file import (
    BadBlockFile,
    HostBlock,
    check_identity,
    data_size,
    decode,
    encode,
    encoded_size,
    read_metadata,
    to_device,
    to_host,
)
from .layers import BlockArrays

logger = logging.getLogger(__name__)

#: Spilled blocks waiting for the writer thread; beyond this a spill is skipped rather than
#: hold the MLX thread (an eviction burst of a 32-layer model is a few hundred blocks).
WRITER_QUEUE_BLOCKS = 256
#: Bytes of spilled blocks waiting for the writer thread. Each queued block keeps its arrays
#: alive (memory the store has let go) until it is written, so a writer that lags (a slow or
#: busy disk) would otherwise hold up to WRITER_QUEUE_BLOCKS blocks: about 2 GiB for an
#: 8B model's 64-token blocks. 256 MiB is a second or two of a local SSD's writes, and a few
#: blocks of even a 70B model; a spill past it is skipped (counted in ``num_skipped_behind``),
#: except into an empty queue, so a block larger than this still spills.
WRITER_QUEUE_BYTES = 256 * 1024 * 1024
_TMP_SUFFIX = ".tmp"


#: Parameters (and values of each) fingerprinted into a model's identity: enough to tell two
#: checkpoints of one architecture apart, cheap at load.
_IDENTITY_PARAMS = 4
_IDENTITY_VALUES = 4096


def host_nbytes(host: HostBlock) -> int:
    """Bytes of a block's arrays on the host (views of its MLX arrays: the memory it holds)."""
    return sum(array.nbytes for array in host[0].values())


def model_identity(model: Any, kinds: tuple[str, ...], block_size: int) -> str:
    """What a block file must name to be this model's: its arguments, cache layout, block size
    and a fingerprint of its first weights (files of any other model are foreign)."""
    h = hashlib.sha256(repr(getattr(model, "args", type(model).__name__)).encode())
    h.update(repr((kinds, block_size)).encode())
    for name, value in tree_flatten(model.parameters())[:_IDENTITY_PARAMS]:
        sample = value.reshape(-1)[:_IDENTITY_VALUES]
        if sample.dtype == mx.bfloat16:
            sample = sample.view(mx.uint16)
        h.update(name.encode() + np.asarray(sample).tobytes())
    return h.hexdigest()[:32]


@attrs.define(slots=True)
class DiskTierStats:
    """Counters since the tier opened, and its gauges."""

    num_files: int = 0
    bytes_used: int = 0
    num_spilled: int = 0
    num_skipped: int = 0
    #: Of those, skipped because the writer had WRITER_QUEUE_BYTES (or BLOCKS) queued.
    num_skipped_behind: int = 0
    num_hits: int = 0
    num_misses: int = 0
    num_bad_files: int = 0
    num_evicted: int = 0


class DiskTier:
    """Spilled full blocks by hash, bounded by ``max_bytes``. Call from one thread (the MLX
    thread); the writer thread is internal."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int,
        model_id: str,
        *,
        max_queued_bytes: int = WRITER_QUEUE_BYTES,
    ):
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.model_id = model_id
        self.max_queued_bytes = max_queued_bytes
        self._index: collections.OrderedDict[str, int] = collections.OrderedDict()  # hex -> bytes, LRU first
        self._queued: dict[str, HostBlock] = {}  # spilled, not yet written (guarded by _lock)
        self._queued_bytes = 0  # arrays of the write jobs not yet done (guarded by _lock)
        self._lock = threading.Lock()
        self._jobs: queue.Queue[tuple[str, str | None, HostBlock | None] | None] = queue.Queue(
            maxsize=WRITER_QUEUE_BLOCKS
        )
        self.stats = DiskTierStats()
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, name="prefix-disk-writer", daemon=True)
        self._writer.start()

    # -- the MLX thread's side ----------------------------------------------------------

    def __contains__(self, key: bytes) -> bool:
        return key.hex() in self._index

    def __len__(self) -> int:
        return len(self._index)

    @property
    def bytes_used(self) -> int:
        return sum(self._index.values())

    @property
    def queued_bytes(self) -> int:
        """Bytes of block arrays the writer thread still holds (spilled, not yet written)."""
        with self._lock:
            return self._queued_bytes

    def spill(self, key: bytes, block: BlockArrays) -> bool:
        """Queue a block evicted from memory for writing; False if it is not kept (on disk
        already, larger than the whole budget, or the writer is behind)."""
        key_hex = key.hex()
        if key_hex in self._index:
            self._index.move_to_end(key_hex)
            return False
        host = to_host(block)
        nbytes = encoded_size(host, model_id=self.model_id, key_hex=key_hex)
        if nbytes > self.max_bytes:
            self.stats.num_skipped += 1
            return False
        if not self._enqueue_write(key_hex, host):
            self.stats.num_skipped += 1
            self.stats.num_skipped_behind += 1
            return False
        self._index[key_hex] = nbytes
        self.stats.num_spilled += 1
        self._evict_over_budget()
        return True

    def load(self, key: bytes) -> BlockArrays | None:
        """The block spilled under ``key``, or None (a miss; a bad file is deleted)."""
        key_hex = key.hex()
        if key_hex not in self._index:
            self.stats.num_misses += 1
            return None
        with self._lock:
            host = self._queued.get(key_hex)
        if host is None:
            host = self._read(key_hex)
        if host is None:
            self.stats.num_misses += 1
            return None
        self._index.move_to_end(key_hex)
        self.stats.num_hits += 1
        return to_device(host)

    def discard(self, key: bytes) -> None:
        """Forget a block and delete its file (e.g. it is back in memory and will spill again)."""
        key_hex = key.hex()
        if self._index.pop(key_hex, None) is not None:
            self._jobs.put(("delete", key_hex, None))

    def clear(self) -> None:
        """Delete every spilled block (``DELETE /v1/cache``). Writes still queued are dropped
        first: their files would be deleted anyway, and each holds its block's arrays (MLX
        memory the store has let go) until the writer gets to it."""
        self._index.clear()
        self._cancel_queued_jobs()
        self._jobs.put(("clear", None, None))

    def flush(self) -> None:
        """Wait until every queued write and delete is done."""
        self._jobs.join()

    def close(self) -> None:
        """Finish queued work and stop the writer thread."""
        self._jobs.put(None)
        self._writer.join()

    def snapshot_stats(self) -> DiskTierStats:
        self.stats.num_files, self.stats.bytes_used = len(self._index), self.bytes_used
        return attrs.evolve(self.stats)

    # -- internals ----------------------------------------------------------------------

    def _enqueue_write(self, key_hex: str, host: HostBlock) -> bool:
        """Queue a write unless the writer already holds WRITER_QUEUE_BYTES (or BLOCKS)."""
        size = host_nbytes(host)
        with self._lock:
            if self._queued_bytes and self._queued_bytes + size > self.max_queued_bytes:
                return False
            self._queued[key_hex] = host
            self._queued_bytes += size
        try:
            self._jobs.put_nowait(("write", key_hex, host))
        except queue.Full:
            self._written(key_hex, host)
            return False
        return True

    def _written(self, key_hex: str, host: HostBlock) -> None:
        """A write job is done (or dropped): its arrays are no longer the queue's."""
        with self._lock:
            self._queued_bytes -= host_nbytes(host)
            if self._queued.get(key_hex) is host:  # a later spill of the same block keeps its own copy
                del self._queued[key_hex]

    def _path(self, key_hex: str) -> pathlib.Path:
        return self.directory / f"{key_hex}{SUFFIX}"

    def _read(self, key_hex: str) -> HostBlock | None:
        path = self._path(key_hex)
        try:
            return decode(path.read_bytes(), model_id=self.model_id, key_hex=key_hex)
        except (OSError, BadBlockFile) as exc:
            self._bad_file(key_hex, exc)
            return None

    def _bad_file(self, key_hex: str, reason: BaseException) -> None:
        logger.warning("prefix disk tier: %s is not a usable block (%s); deleted", self._path(key_hex).name, reason)
        self.stats.num_bad_files += 1
        if self._index.pop(key_hex, None) is not None:
            self._jobs.put(("delete", key_hex, None))
        else:
            self._path(key_hex).unlink(missing_ok=True)

    def _cancel_queued_jobs(self) -> None:
        """Take every job the writer has not started off its queue (a close stays queued)."""
        closing = False
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            closing = closing or job is None
            if job is not None and job[0] == "write":
                self._written(job[1], job[2])
            self._jobs.task_done()
        if closing:
            self._jobs.put(None)

    def _evict_over_budget(self) -> None:
        while self._index and self.bytes_used > self.max_bytes:
            key_hex, _ = self._index.popitem(last=False)
            self.stats.num_evicted += 1
            self._jobs.put(("delete", key_hex, None))

    def _scan(self) -> None:
        """Rebuild the index from the directory: oldest first, foreign or unreadable files
        deleted (one WARNING each), temporary leftovers removed, then the budget applied."""
        for leftover in self.directory.glob(f"*{_TMP_SUFFIX}"):
            leftover.unlink(missing_ok=True)
        found = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            key_hex = path.name.removesuffix(SUFFIX)
            try:
                with path.open("rb") as file:
                    head = file.read(64 * 1024)
                    header, start = read_metadata(head if len(head) < 64 * 1024 else head + file.read())
                check_identity(header["__metadata__"], model_id=self.model_id, key_hex=key_hex)
                stat = path.stat()
                if stat.st_size < start + data_size(header):
                    raise BadBlockFile("truncated")
            except (OSError, BadBlockFile) as exc:
                self._bad_file(key_hex, exc)
                continue
            found.append((stat.st_mtime_ns, key_hex, stat.st_size))
        for _, key_hex, size in sorted(found):
            self._index[key_hex] = size
        while self._index and self.bytes_used > self.max_bytes:
            key_hex, _ = self._index.popitem(last=False)
            self._path(key_hex).unlink(missing_ok=True)

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            try:
                self._do(*job)
            except OSError as exc:  # a full or read-only disk: the block is just not kept
                logger.warning("prefix disk tier: %s failed (%s)", job[0], exc)
            finally:
                job = None  # a written block's arrays (numpy views of MLX memory) go now, not at the next job
                self._jobs.task_done()
        self._jobs.task_done()

    def _do(self, action: str, key_hex: str | None, host: HostBlock | None) -> None:
        if action == "clear":
            for path in self.directory.glob(f"*{SUFFIX}"):
                path.unlink(missing_ok=True)
            return
        assert key_hex is not None
        if action == "delete":
            self._path(key_hex).unlink(missing_ok=True)
            return
        assert host is not None
        try:
            tmp = self._path(key_hex).with_suffix(_TMP_SUFFIX)
            tmp.write_bytes(encode(host, model_id=self.model_id, key_hex=key_hex))
            os.replace(tmp, self._path(key_hex))
        finally:
            self._written(key_hex, host)
