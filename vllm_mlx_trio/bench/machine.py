"""What machine a benchmark ran on, and which BLAS the MLX process computes with.

MLX's Linux CPU wheel bundles the reference BLAS (``mlx_cpu.libs/libblas-*.so.3``), whose
float32 matmuls are slow; preloading OpenBLAS (``LD_PRELOAD``) replaces it. MLX's CUDA wheels
bundle the same reference BLAS for the CPU and multiply on the GPU with cuBLAS (from the
``nvidia-cublas`` wheels): where cuBLAS is mapped, the line names both. The BLAS is detected
from the shared libraries mapped into the process (``/proc/<pid>/maps``), so it is only known
after MLX is loaded, and for another process only where ``/proc`` exists.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys

#: (pattern on the library's file name, name) in order of precedence: a preloaded OpenBLAS
#: or MKL wins over the reference libblas that stays mapped behind it.
_BLAS_LIBS = (
    (re.compile(r"libopenblas"), "OpenBLAS"),
    (re.compile(r"libmkl_rt|libmkl_core"), "MKL"),
    (re.compile(r"libblis"), "BLIS"),
    (re.compile(r"Accelerate\.framework|libBLAS\.dylib"), "Accelerate"),
    (re.compile(r"libcblas|libblas"), "reference"),
)


def mapped_libraries(maps_text: str) -> list[str]:
    """Distinct shared-library paths in a ``/proc/<pid>/maps`` text, in first-seen order."""
    seen: dict[str, None] = {}
    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and (".so" in parts[5] or ".dylib" in parts[5]):
            seen.setdefault(parts[5].strip(), None)
    return list(seen)


#: The GPU's BLAS of MLX's CUDA backend (``libcublas.so.12``; not ``libcublasLt``).
_CUBLAS = re.compile(r"^libcublas\.so")


def describe_blas(libraries: list[str], *, ld_preload: str = "", system: str = "Linux") -> str:
    """``"OpenBLAS (LD_PRELOAD)"``, ``"reference (libblas.so.3 bundled with mlx)"``, ...; with
    cuBLAS mapped, ``"cuBLAS (libcublas.so.12) on the GPU, reference (...) on the CPU"``."""
    cpu = _cpu_blas(libraries, ld_preload=ld_preload, system=system)
    gpu = next((os.path.basename(lib) for lib in libraries if _CUBLAS.match(os.path.basename(lib))), None)
    return f"cuBLAS ({gpu}) on the GPU, {cpu} on the CPU" if gpu else cpu


def _cpu_blas(libraries: list[str], *, ld_preload: str, system: str) -> str:
    for pattern, name in _BLAS_LIBS:
        found = next((lib for lib in libraries if pattern.search(os.path.basename(lib))), None)
        if found is None:
            continue
        base = os.path.basename(found)
        if name == "reference":
            where = "bundled with mlx" if "mlx" in found else found
            return f"reference ({base} {where})"
        how = "LD_PRELOAD" if _preloaded(found, ld_preload) else found
        return f"{name} ({how})"
    if system == "Darwin":
        return "Accelerate (macOS)"
    return "unknown (no BLAS library mapped)"


def _preloaded(library: str, ld_preload: str) -> bool:
    """Whether ``library`` (as mapped: symlinks resolved) is one of ``LD_PRELOAD``'s entries."""
    for entry in ld_preload.replace(":", " ").split():
        if entry == library or os.path.realpath(entry) == os.path.realpath(library):
            return True
    return False


def process_blas(pid: int | str = "self", environ: dict[str, str] | None = None) -> str:
    """The BLAS of process ``pid`` (default: this one), from its memory maps."""
    if platform.system() == "Darwin":
        return "Accelerate (macOS)"
    try:
        with open(f"/proc/{pid}/maps") as f:
            libraries = mapped_libraries(f.read())
    except OSError as exc:
        return f"unknown (cannot read /proc/{pid}/maps: {exc.strerror})"
    if environ is None:
        environ = dict(os.environ) if pid == "self" else _process_environ(pid)
    return describe_blas(libraries, ld_preload=environ.get("LD_PRELOAD", ""))


def _process_environ(pid: int | str) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            items = f.read().split(b"\0")
    except OSError:
        return {}
    return dict(item.decode(errors="replace").partition("=")[::2] for item in items if b"=" in item)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine_info(*, server_pid: int | None = None, device: str | None = None) -> dict:
    """Platform, CPUs, MLX version and device, and the BLAS of the MLX process.

    The MLX process is this one unless ``server_pid`` names another (a peer server). The
    device, unless given, is only asked of MLX when this process already imported it.
    """
    if device is None:
        device = _device_of_this_process()
    if server_pid is None and "mlx.core" not in sys.modules:
        blas = "n/a (mlx not loaded in this process)"
    else:
        blas = process_blas("self" if server_pid is None else server_pid)
    return {
        "platform": f"{platform.system()} {platform.machine()} ({platform.platform()})",
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "device": device,
        "blas": blas,
    }


def _device_of_this_process() -> str:
    if "mlx.core" not in sys.modules:
        return "n/a (mlx not loaded in this process)"
    from ..worker.ceiling import mlx_device

    return mlx_device()


def format_machine(info: dict) -> str:
    return (
        f"machine: {info['platform']}, {info['cpu_count']} CPUs, python {info['python']}, "
        f"MLX {info['mlx']} (mlx-lm {info['mlx_lm']}), device: {info['device']}\n"
        f"BLAS: {info['blas']}"
    )
