"""A fast BLAS under MLX's CPU backend on Linux, loaded before MLX is.

MLX's Linux CPU wheel links the reference BLAS, so its float32 matrix products run at a few
GFLOP/s. MLX calls ``cblas_sgemm`` through the dynamic linker's global scope, so a CBLAS library
loaded with ``RTLD_GLOBAL`` before ``mlx.core`` serves those calls instead: Intel's MKL from the
``cpu-fast`` extra (the ``mkl`` wheel puts ``libmkl_rt`` in the environment's ``lib``), or any
library named by ``$VLLM_MLX_TRIO_BLAS`` (a system OpenBLAS, say). ``VLLM_MLX_TRIO_BLAS=off``
keeps the reference BLAS. bfloat16 and quantized products never go through BLAS and are unchanged.
On MLX's CUDA backend (the ``cuda`` and ``cuda13`` extras, which bring no ``mkl``) the model's
products run on the GPU through cuBLAS; a library loaded here would serve only CPU-side float32
products, so nothing here depends on the device.

This module imports nothing heavy: the package's ``__init__`` runs :func:`preload_fast_blas`.
"""

from __future__ import annotations

import ctypes
import glob
import logging
import os
import pathlib
import sys

logger = logging.getLogger(__name__)

ENV_VAR = "VLLM_MLX_TRIO_BLAS"
_OFF = {"off", "0", "none", "reference"}
#: What the ``mkl`` wheel installs (``libmkl_rt.so.2`` up to 2025, ``.so.3`` after).
_MKL_GLOB = "libmkl_rt.so*"


def candidate_library() -> str | None:
    """The CBLAS library to load: ``$VLLM_MLX_TRIO_BLAS``, else MKL in this environment."""
    chosen = os.environ.get(ENV_VAR, "").strip()
    if chosen.lower() in _OFF:
        return None
    if chosen:
        return chosen
    found = sorted(glob.glob(os.path.join(sys.prefix, "lib", _MKL_GLOB)), key=len)
    return found[0] if found else None


def preload_fast_blas() -> str | None:
    """Load the fast BLAS globally if MLX is not loaded yet; the library's path, else None."""
    if not sys.platform.startswith("linux") or "mlx.core" in sys.modules:
        return None
    library = candidate_library()
    if library is None:
        return None
    try:
        ctypes.CDLL(library, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        logger.warning("%s=%s could not be loaded (%s); MLX keeps its reference BLAS", ENV_VAR, library, exc)
        return None
    return library


def loaded_blas() -> str | None:
    """The fast BLAS this process has loaded (its file name), read from the process's own
    memory map; None when MLX runs on its bundled reference BLAS."""
    library = candidate_library()
    maps = pathlib.Path("/proc/self/maps")
    if library is None or not maps.exists():
        return None
    name = pathlib.Path(library).name
    return name if name in maps.read_text() else None
