"""``bench peers``: the same HTTP benchmark against each server, each in its own process.

Each peer serves the same local model directory on its own port; the benchmark waits until
``/v1/models`` answers, runs ``bench http`` against it, reads the server's peak resident memory
(``VmHWM`` in ``/proc/<pid>/status``) and its BLAS (``/proc/<pid>/maps``), then stops it.
The server's output goes to a log file whose tail is shown if it fails to start.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

import attrs
import httpx

from .http import BenchError

PEERS = ("ours", "mlx-lm", "vllm-mlx", "mlx-vlm")
#: The vllm-mlx executable when ``--vllm-mlx`` names none (it lives in a venv of its own).
VLLM_MLX_ENV = "VLLM_MLX_TRIO_BENCH_VLLM_MLX"
VLLM_MLX = "vllm-mlx"


#: How our servers and child processes start Python: ``-P`` keeps the current directory off the front of
#: ``sys.path``, so ``PYTHONPATH`` (the checkout being measured) decides which copy of this package runs. Without
#: it, ``python -m`` run from inside another checkout would import that one instead, and a before/after
#: comparison would measure the same code twice.
OUR_PYTHON = (sys.executable, "-P")


@attrs.frozen(kw_only=True)
class PeerServer:
    """How to start one peer: its command line and the model name its requests use."""

    name: str
    argv: tuple[str, ...]
    #: The ``model`` field of requests; None asks the server's ``/v1/models``.
    model: str | None
    #: Environment variables set for the server (on top of this process's environment).
    env: dict[str, str] = attrs.field(factory=dict)


def vllm_mlx_executable(given: str | None = None, environ: dict[str, str] | None = None) -> str:
    """``given`` (``--vllm-mlx``), else ``$VLLM_MLX_TRIO_BENCH_VLLM_MLX``, else ``vllm-mlx`` on
    the ``PATH``; a peer whose executable is not found is left out with a note."""
    environ = os.environ if environ is None else environ
    return given or environ.get(VLLM_MLX_ENV) or shutil.which(VLLM_MLX) or VLLM_MLX


def peer_server(name: str, model_dir: str, port: int, *, vllm_mlx: str = VLLM_MLX, scratch: str = "/tmp") -> PeerServer:
    """The command line that serves ``model_dir`` on ``port`` with continuous batching.

    vllm-mlx saves its prefix cache under ``~/.cache/vllm-mlx`` at shutdown and loads it at
    start-up; its ``HOME`` is ``scratch`` so that one run's cache cannot speed up the next.
    """
    py = sys.executable
    if name == "ours":
        argv = (
            *OUR_PYTHON,
            "-m",
            "vllm_mlx_trio.cli",
            "serve",
            "--set",
            f"model.path={model_dir}",
            "--set",
            f"server.port={port}",
            "--set",
            "logging.level=warning",
        )
        return PeerServer(name=name, argv=argv, model=model_dir, env={"PYTHONPATH": _our_pythonpath()})
    if name == "mlx-lm":  # batches requests itself (--decode-concurrency, default 32)
        argv = (py, "-m", "mlx_lm.server", "--model", model_dir, "--port", str(port), "--log-level", "WARNING")
        return PeerServer(name=name, argv=argv, model="default_model")
    if name == "vllm-mlx":
        argv = (vllm_mlx, "serve", model_dir, "--port", str(port), "--continuous-batching")
        return PeerServer(name=name, argv=argv, model=None, env={"HOME": scratch})
    if name == "mlx-vlm":  # mlx-vlm's own server: continuous batching and its vision cache on by default
        argv = (py, "-m", "mlx_vlm.server", "--model", model_dir, "--port", str(port), "--host", "127.0.0.1")
        return PeerServer(name=name, argv=argv, model=model_dir, env={"HOME": scratch})
    raise ValueError(f"unknown peer {name!r}; expected one of {', '.join(PEERS)}")


def _our_pythonpath() -> str:
    """This checkout first on the path, so ``-m vllm_mlx_trio.cli`` runs the code benchmarked."""
    here = str(pathlib.Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


def peak_rss_mib(pid: int) -> float | None:
    """``VmHWM`` (peak resident set) of a live process, in MiB; None where unreadable."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def wait_ready(proc: subprocess.Popen, base_url: str, timeout_s: float) -> None:
    """Poll ``/v1/models`` until it answers 200; raise if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BenchError(f"server exited with status {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{base_url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise BenchError(f"server not ready after {timeout_s:.0f} s")


def stop(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def port_free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (else we would benchmark a stranger)."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _describe(exc: BaseException) -> str:
    """One line for an error, exception groups (Trio's nurseries) flattened."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


def _log_tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_peer(peer: PeerServer, port: int, bench, *, startup_timeout_s: float, log_dir: pathlib.Path) -> dict:
    """Start ``peer``, run ``bench(base_url, model, pid, name) -> section``, record peak RSS, stop it."""
    if not shutil.which(peer.argv[0]) and not os.path.exists(peer.argv[0]):
        return {"peer": peer.name, "error": f"{peer.argv[0]} not found", "argv": list(peer.argv)}
    if not port_free(port):
        return {"peer": peer.name, "error": f"port {port} is in use", "argv": list(peer.argv)}
    log_path = log_dir / f"{peer.name}.log"
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            peer.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **peer.env}
        )
    started = time.monotonic()
    try:
        wait_ready(proc, base_url, startup_timeout_s)
        ready_s = round(time.monotonic() - started, 1)
        section = bench(base_url, peer.model, proc.pid, peer.name)
        rss = peak_rss_mib(proc.pid)
    except Exception as exc:  # boundary: one peer's failure must not stop the others
        return {"peer": peer.name, "error": _describe(exc), "argv": list(peer.argv), "log_tail": _log_tail(log_path)}
    finally:
        stop(proc)
    for row in section["rows"]:
        row["peak_rss_mib"] = rss
    return {"peer": peer.name, "argv": list(peer.argv), "ready_s": ready_s, "peak_rss_mib": rss, **section}


def run_peers(
    names: Sequence[str],
    model_dir: str,
    bench,
    *,
    port: int = 8701,
    vllm_mlx: str = VLLM_MLX,
    startup_timeout_s: float = 120.0,
) -> list[dict]:
    """Each peer in turn, on ports ``port``, ``port + 1``, ..."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        for offset, name in enumerate(names):
            peer = peer_server(name, model_dir, port + offset, vllm_mlx=vllm_mlx, scratch=tmp)
            results.append(
                run_peer(peer, port + offset, bench, startup_timeout_s=startup_timeout_s, log_dir=pathlib.Path(tmp))
            )
    return results
