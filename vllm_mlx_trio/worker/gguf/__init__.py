"""GGUF files served directly (llama.cpp's format): the header checked (file), the architecture
mapped onto mlx-lm's models (arch), the tokenizer rebuilt (tokenizer), the tensors kept packed or
dequantized (weights), all put together (loader)."""

from .file import GGUFError, gguf_file, is_gguf_path, read_header
from .loader import NATIVE, default_gguf_cache_dir, load_gguf
from .weights import FLOAT_DTYPES

__all__ = [
    "FLOAT_DTYPES",
    "NATIVE",
    "GGUFError",
    "default_gguf_cache_dir",
    "gguf_file",
    "is_gguf_path",
    "load_gguf",
    "read_header",
]
