"""The built-in demo models (random weights in real architectures), built locally.

``files`` (tokenizer, byte-exact writers) and ``recipe`` (names, presets, template, install)
are shared; ``model`` (Qwen3 text), ``spec``, ``vlm``, ``mtp`` and ``mtp_dsv3`` write one kind of
model each; ``table`` names them all. Import the public names from here.
"""

from .recipe import (
    CHAT_TEMPLATE,
    DEMO_FORMAT_VERSION,
    DEMO_MARKER,
    DEMO_PREFIX,
    DEMO_SIZES,
    chat_template_hash,
    default_demo_cache_dir,
    is_demo_path,
)
from .table import DEMO_BUILDERS, build_demo_model, resolve_demo_model

__all__ = [
    "CHAT_TEMPLATE",
    "DEMO_BUILDERS",
    "DEMO_FORMAT_VERSION",
    "DEMO_MARKER",
    "DEMO_PREFIX",
    "DEMO_SIZES",
    "build_demo_model",
    "chat_template_hash",
    "default_demo_cache_dir",
    "is_demo_path",
    "resolve_demo_model",
]
