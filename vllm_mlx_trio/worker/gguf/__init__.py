"""GGUF files served directly (llama.cpp's format): the header checked (file), the architecture
mapped onto mlx-lm's models (arch), the tokenizer rebuilt (tokenizer), both written into a small
folder (sidecar), the tensors kept packed or dequantized (weights), all put together (loader;
dtype says what ``gguf_dtype = "auto"`` picks).

This ``__init__`` imports no MLX (the benchmarks' clients use the sidecar); the MLX parts are
imported from their modules: ``from .gguf.loader import load_gguf``.
"""

from .file import GGUFError, gguf_file, is_gguf_path, read_header
from .sidecar import GGUFModel, default_gguf_cache_dir, open_gguf_model, tokenizer_dir

__all__ = [
    "GGUFError",
    "GGUFModel",
    "default_gguf_cache_dir",
    "gguf_file",
    "is_gguf_path",
    "open_gguf_model",
    "read_header",
    "tokenizer_dir",
]
