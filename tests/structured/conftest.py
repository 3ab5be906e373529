"""The demo tokenizer as llguidance sees it (no mlx: the tokenizer JSON only)."""

from __future__ import annotations

import pathlib

import pytest
from llguidance import LLTokenizer

from vllm_mlx_trio.worker.demo import resolve_demo_model

#: <|endoftext|> and <|im_end|> in the demo tokenizer.
DEMO_EOS = (0, 2)


@pytest.fixture(scope="session")
def demo_tiny_dir(demo_cache_dir) -> pathlib.Path:
    return resolve_demo_model("demo:tiny", demo_cache_dir)


@pytest.fixture(scope="session")
def llg_tokenizer(demo_tiny_dir) -> LLTokenizer:
    return LLTokenizer((demo_tiny_dir / "tokenizer.json").read_text(), eos_token=list(DEMO_EOS))
