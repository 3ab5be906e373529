"""CPU time a process (and its main thread) spent, from Linux's ``/proc``: what a server costs
per token, a figure the machine's load moves far less than tokens per second.

On a machine with few cores, every millisecond a server's event loop spends per token comes out
of the model's share; wall-clock throughput also drifts with whatever else the machine runs,
CPU time much less. ``/proc/<pid>/stat`` gives the process's user and system time (all its
threads), ``/proc/<pid>/task/<pid>/stat`` its main thread's, in clock ticks.
"""

from __future__ import annotations

import os
import pathlib

import attrs

#: Fields 14 and 15 of ``stat`` (utime, stime), counted after the ``(comm)`` field, which may hold spaces.
_UTIME_AFTER_COMM = 11


@attrs.frozen
class CpuTimes:
    """Seconds of CPU (user + system) a process and its main thread had used."""

    process_s: float
    main_thread_s: float


def _stat_seconds(path: pathlib.Path) -> float | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    ticks = int(fields[_UTIME_AFTER_COMM]) + int(fields[_UTIME_AFTER_COMM + 1])
    return ticks / os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int | None) -> CpuTimes | None:
    """The CPU ``pid`` and its main thread have used so far; None without a pid or ``/proc``."""
    if pid is None:
        return None
    process = _stat_seconds(pathlib.Path(f"/proc/{pid}/stat"))
    main = _stat_seconds(pathlib.Path(f"/proc/{pid}/task/{pid}/stat"))
    if process is None or main is None:
        return None
    return CpuTimes(process_s=process, main_thread_s=main)


def ms_per_token(before: CpuTimes | None, after: CpuTimes | None, tokens: int) -> tuple[float | None, float | None]:
    """(process, main thread) milliseconds of CPU per token between two readings; None where
    either reading or the tokens are missing."""
    if before is None or after is None or tokens <= 0:
        return None, None
    process = (after.process_s - before.process_s) * 1000 / tokens
    main = (after.main_thread_s - before.main_thread_s) * 1000 / tokens
    return round(process, 3), round(main, 3)
