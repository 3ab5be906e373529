"""vllm-mlx-trio: an OpenAI-compatible LLM server on MLX, built as Trio actors.

The public API: :func:`open_engine` and :class:`Engine` to embed the engine in a Trio
program, :func:`load_config` / :class:`EngineConfig` for configuration, :func:`serve` to run
the HTTP server. Importing this package does not import MLX; only the executor thread does.
"""

from .config import EngineConfig, load_config
from .core.params import SamplingParams
from .engine import Engine, open_engine
from .serve import serve
from .stream import Delta, RequestStream, Usage

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
