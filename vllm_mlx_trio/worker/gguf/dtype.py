"""Which dtype a GGUF file's weights are served in (``[model] gguf_dtype``).

"auto" keeps the file's packed layout, except on MLX's CPU backend with a fast BLAS loaded
(cpu_blas.py): there float32 matrix products run on that BLAS, and SmolLM2-135M's Q4_1 file
served in float32 prefilled 30x and decoded 3.4x faster than packed (docs/benchmarks.md).
Without a fast BLAS the packed layout is faster (decoding 9.1 against 5.7 tok/s in float32).
"""

from __future__ import annotations

import mlx.core as mx

from ...cpu_blas import loaded_blas
from .loader import NATIVE

AUTO = "auto"


def gguf_dtype(setting: str) -> str:
    """The dtype ``setting`` means on this machine: "native" or a float dtype's name."""
    if setting != AUTO:
        return setting
    on_cpu = mx.default_device() == mx.cpu
    return "float32" if on_cpu and loaded_blas() is not None else NATIVE
