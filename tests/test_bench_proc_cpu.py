"""The CPU a process and its main thread used, from ``/proc``, and ``bench latency``'s per-token
figures from two readings. Nothing here measures speed: the busy loop only has to use some CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from vllm_mlx_trio.bench.latency.run import add_cpu_figures, lanes
from vllm_mlx_trio.bench.proc_cpu import CpuTimes, cpu_times, ms_per_token
from vllm_mlx_trio.bench.stats import RequestTrace

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")

#: CPU a busy loop uses before it is read again: many clock ticks (10 ms each at 100 Hz).
BUSY_S = 0.3


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_busy_thread_counts_for_the_process_and_not_its_main_thread():
    before = cpu_times(os.getpid())
    worker = threading.Thread(target=_spin, args=(BUSY_S,))
    worker.start()
    worker.join()
    after = cpu_times(os.getpid())
    assert before is not None and after is not None
    assert after.process_s - before.process_s >= BUSY_S * 0.9
    assert after.main_thread_s - before.main_thread_s < BUSY_S / 2  # the main thread only waited


def test_the_main_thread_of_another_process_is_read():
    """The child spins on its main thread, says so, and waits to be told to exit."""
    spinner = f"import time\nend = time.process_time() + {BUSY_S}\nwhile time.process_time() < end: pass\n"
    spinner += "print('spun', flush=True)\ninput()"
    child = subprocess.Popen([sys.executable, "-c", spinner], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"spun\n"
        times = cpu_times(child.pid)
        assert times is not None and times.main_thread_s >= BUSY_S * 0.9
        assert times.process_s >= times.main_thread_s
    finally:
        child.communicate(b"\n", timeout=30)
    assert cpu_times(child.pid) is None  # gone: nothing to read
    assert cpu_times(None) is None


def test_per_token_figures_are_the_difference_over_the_tokens():
    before, after = CpuTimes(process_s=1.0, main_thread_s=0.5), CpuTimes(process_s=3.0, main_thread_s=0.9)
    assert ms_per_token(before, after, 1000) == (2.0, 0.4)
    assert ms_per_token(None, after, 1000) == (None, None)
    assert ms_per_token(before, after, 0) == (None, None)


def test_rows_get_the_loop_figure_only_for_our_servers():
    before, after = CpuTimes(process_s=1.0, main_thread_s=0.5), CpuTimes(process_s=1.5, main_thread_s=0.6)
    traces = [RequestTrace(start=0.0, arrivals=((0.01, 125.0),), completion_tokens=125)] * 2
    ours, peer = {}, {}
    add_cpu_figures(ours, before, after, traces, event_loop=True)
    add_cpu_figures(peer, before, after, traces, event_loop=False)
    assert ours == {"cpu_ms_per_token": 2.0, "loop_cpu_ms_per_token": 0.4}
    assert peer == {"cpu_ms_per_token": 2.0, "loop_cpu_ms_per_token": None}


def test_every_lane_of_a_server_reads_that_servers_process():
    from vllm_mlx_trio.bench.http import HttpTarget

    targets = {name: HttpTarget(base_url=f"http://{name}", model="m") for name in ("ours", "mlx-lm")}
    got = {lane.label: lane.pid for lane in lanes(targets, (1, 4), {"ours": 11, "mlx-lm": 22})}
    assert got == {"ours-si1": 11, "ours-si4": 11, "mlx-lm": 22}
    assert all(lane.pid is None for lane in lanes(targets, ()))
