"""How much memory the machine has available, for budgets set as a share of it. Pure stdlib."""

from __future__ import annotations

import os
import pathlib

#: Used when neither /proc/meminfo nor sysconf can tell (a budget must be finite).
FALLBACK_AVAILABLE_BYTES = 8 * 1024**3


def available_memory_bytes() -> int:
    """MemAvailable on Linux; elsewhere the physical memory sysconf reports."""
    meminfo = pathlib.Path("/proc/meminfo")
    if meminfo.exists():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return FALLBACK_AVAILABLE_BYTES
