"""What the soak measures before and after: memory, file descriptors, Trio tasks, live
per-request objects and the engine's own state.

MLX memory is the figure the engine already reports: the executor reads it on the MLX thread
at the end of every step (``statistics().scheduler.mlx_active_bytes``). To read it in the
same state both times, :func:`measure` empties the prefix cache, then runs :data:`PROBES`
identical probe requests (the first one's step drops the cleared blocks on the MLX thread)
and keeps the lowest reading and the spread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import resource
import sys
import threading
import types

import attrs
import httpx
import trio

from ...core.params import SamplingParams
from ...core.request import Request
from ...engine import Engine
from ...http.request_log import RequestRecord
from ...stream import RequestStream

#: The probe: a short fixed prompt, one greedy token, sent this many times one after another.
PROBE_PROMPT = "soak probe"
PROBES = 8
#: Polling period while waiting for the server to go quiet.
QUIESCE_POLL_S = 0.05
#: Live objects counted (after a full collection): one of each per request in flight, so any
#: that outlives its request shows up here.
WATCHED_TYPES: dict[str, type] = {
    "core.Request": Request,
    "RequestStream": RequestStream,
    "RequestRecord": RequestRecord,
    "trio.MemorySendChannel": trio.MemorySendChannel,
    "trio.MemoryReceiveChannel": trio.MemoryReceiveChannel,
    "trio Task": trio.lowlevel.Task,
    "httpx.Response": httpx.Response,
    #: A retained exception keeps its traceback, and the traceback the frames of its call. Frames
    #: themselves are not counted: a running coroutine's frame object appears whenever something
    #: walks the stack (``logging`` finding its caller does) and lives as long as the coroutine,
    #: so a long-lived task's first log line would read as a leak.
    "traceback": types.TracebackType,
}


@attrs.frozen(kw_only=True)
class Snapshot:
    """One measurement of the whole process (server and soak clients share it)."""

    #: The lowest of the probes' readings, and highest minus lowest.
    mlx_active_bytes: int
    mlx_active_spread: int
    mlx_cache_bytes: int
    rss_bytes: int | None
    max_rss_bytes: int
    fds: int
    tasks: int
    threads: int
    engine_requests: int
    running: int
    waiting: int
    plans_in_flight: int
    cache_leased: int
    cache_blocks_in_use: int
    cache_blocks: int
    #: Prompt lookups that found cached blocks, since the start (the soak leased some).
    cache_hits: int
    objects: dict[str, int]

    @property
    def engine_idle(self) -> bool:
        return not (self.engine_requests or self.running or self.waiting or self.plans_in_flight)

    @property
    def cache_released(self) -> bool:
        return not (self.cache_leased or self.cache_blocks_in_use)


def rss_bytes() -> int | None:
    """This process's resident set (``VmRSS``), or None where ``/proc`` is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def trim_heap() -> bool:
    """Ask glibc to hand its free heap pages back to the system (``malloc_trim(0)``), so RSS
    counts memory in use rather than the allocator's free lists. False where there is no
    glibc (macOS, musl): RSS is then read as it is."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


def max_rss_bytes() -> int:
    """``getrusage``'s peak RSS: kilobytes on Linux, bytes on macOS."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def open_fds() -> int:
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    return len(os.listdir(fd_dir))


def live_tasks() -> int:
    """Every task in this Trio run, from the root task down."""
    count, stack = 0, [trio.lowlevel.current_root_task()]
    while stack:
        task = stack.pop()
        if task is None:
            continue
        count += 1
        for nursery in task.child_nurseries:
            stack.extend(nursery.child_tasks)
    return count


def live_objects() -> dict[str, int]:
    """How many objects of each :data:`WATCHED_TYPES` are alive, after a full collection."""
    gc.collect()
    wanted = {cls: name for name, cls in WATCHED_TYPES.items()}
    counts = dict.fromkeys(WATCHED_TYPES, 0)
    for obj in gc.get_objects():
        name = wanted.get(type(obj))
        if name is not None:
            counts[name] += 1
    return counts


def snapshot(engine: Engine, mlx_active: list[int]) -> Snapshot:
    """Everything at once; ``mlx_active`` holds the probes' readings."""
    objects = live_objects()
    trim_heap()
    stats = engine.statistics()
    scheduler, cache = stats.scheduler, stats.cache
    return Snapshot(
        mlx_active_bytes=min(mlx_active),
        mlx_active_spread=max(mlx_active) - min(mlx_active),
        mlx_cache_bytes=scheduler.mlx_cache_bytes,
        rss_bytes=rss_bytes(),
        max_rss_bytes=max_rss_bytes(),
        fds=open_fds(),
        tasks=live_tasks(),
        threads=threading.active_count(),
        engine_requests=stats.num_requests,
        running=scheduler.num_running,
        waiting=scheduler.num_waiting,
        plans_in_flight=scheduler.plans_in_flight,
        cache_leased=cache.num_leased,
        cache_blocks_in_use=cache.pool.num_in_use,
        cache_blocks=cache.pool.num_blocks,
        cache_hits=cache.num_hits + cache.num_prefix_hits,
        objects=objects,
    )


async def wait_quiet(engine: Engine, baseline: Snapshot | None, timeout_s: float) -> bool:
    """Wait until the engine holds no request and no plan is out on the executor (a plan queued
    behind the last request's finish still runs, naming nobody), and (after the soak) tasks and
    descriptors are back to ``baseline``'s counts, and the task count stays put for one poll.
    False on timeout: the caller measures anyway, and the leftovers show."""

    def settled() -> bool:
        stats = engine.statistics()
        scheduler = stats.scheduler
        if stats.num_requests or scheduler.num_running or scheduler.num_waiting or scheduler.plans_in_flight:
            return False
        return baseline is None or (live_tasks() <= baseline.tasks and open_fds() <= baseline.fds)

    with trio.move_on_after(timeout_s):
        previous = -1
        while True:
            tasks = live_tasks()
            if settled() and tasks == previous:
                return True
            previous = tasks
            await trio.sleep(QUIESCE_POLL_S)
    return False


async def probe(engine: Engine) -> int:
    """One greedy token of a fixed prompt; the MLX active memory its last step reported."""
    async for _delta in engine.generate(PROBE_PROMPT, SamplingParams(max_tokens=1, temperature=0)):
        pass
    return engine.statistics().scheduler.mlx_active_bytes


async def measure(engine: Engine, baseline: Snapshot | None, timeout_s: float) -> tuple[Snapshot, bool]:
    """Wait for quiet, empty the prefix cache, run the probes, then take the snapshot.

    Returns the snapshot and whether the server went quiet within ``timeout_s``.
    """
    quiet = await wait_quiet(engine, baseline, timeout_s)
    await engine.clear_prefix_cache()
    gc.collect()  # arrays held only by garbage cycles are freed before the probes read memory
    mlx_active = [await probe(engine) for _ in range(PROBES)]
    quiet = await wait_quiet(engine, baseline, timeout_s) and quiet
    return snapshot(engine, mlx_active), quiet
