"""vllm-mlx-trio: an OpenAI-compatible LLM server on MLX, built as Trio actors.

The public API: :func:`open_engine` and :class:`Engine` to embed the engine in a Trio
program, :func:`load_config` / :class:`EngineConfig` for configuration, :func:`serve` to run
the HTTP server. Importing this package does not import MLX; only the executor thread does.
On Linux it loads a fast BLAS for MLX's CPU backend first, where one is installed (cpu_blas).

The names are loaded on first use (PEP 562), so importing a part of the package, such as the
pure ``vllm_mlx_trio.core``, does not import the engine, Trio or the HTTP server with it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from .cpu_blas import preload_fast_blas

preload_fast_blas()  # before anything imports mlx.core

#: Public name -> the module (relative to this package) that defines it.
_EXPORTS = {
    "Delta": ".stream",
    "Engine": ".engine",
    "EngineConfig": ".config",
    "RequestStream": ".stream",
    "SamplingParams": ".core.params",
    "Usage": ".stream",
    "load_config": ".config",
    "open_engine": ".engine",
    "serve": ".serve",
}

__all__ = [
    "Delta",
    "Engine",
    "EngineConfig",
    "RequestStream",
    "SamplingParams",
    "Usage",
    "load_config",
    "open_engine",
    "serve",
]

if TYPE_CHECKING:
    from .config import EngineConfig, load_config
    from .core.params import SamplingParams
    from .engine import Engine, open_engine
    from .serve import serve
    from .stream import Delta, RequestStream, Usage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """This package's module type: ``vllm_mlx_trio.serve`` stays the function.

    Loading the submodule ``vllm_mlx_trio.serve`` makes the import system set the package's
    attribute ``serve`` to that module; the function of the same name is the public API, so
    that one assignment is skipped (``__getattr__`` then finds the function)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "serve" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
