"""MLX streams are per thread (MLX 0.32): a thread that ran MLX must destroy its own streams
before it ends or the process exits, or MLX may abort at teardown ("terminate called without
an active exception", exit 134). MLX leaves that cleanup to the caller (``mx.clear_streams``).

The executor thread comes from Trio's thread cache and may run a second engine's runner after
the first one closed, so a runner gives its worker thread a fresh default stream when it loads
and destroys the thread's streams when it closes. The main thread keeps its streams (tests and
tools go on using MLX there) until the process ends: :func:`release_main_thread_streams`.
"""

from __future__ import annotations

import sys
import threading

import mlx.core as mx


def _on_worker_thread() -> bool:
    return threading.current_thread() is not threading.main_thread()


def enter_mlx_thread() -> None:
    """Give a worker thread a default stream of its own (one whose streams a runner may have
    destroyed before, when Trio reuses the thread)."""
    if _on_worker_thread():
        mx.set_default_stream(mx.new_stream(mx.default_device()))


def leave_mlx_thread() -> None:
    """Destroy the streams this worker thread created (no-op on the main thread)."""
    if _on_worker_thread():
        mx.clear_streams()


def release_main_thread_streams() -> None:
    """At process exit: destroy the main thread's streams, if MLX was ever imported."""
    if "mlx.core" in sys.modules and not _on_worker_thread():
        mx.clear_streams()
