"""A llama GGUF file with Llama 3's RoPE scaling (``rope_freqs.weight``, as llama.cpp's converter
writes it) computes what the original model computes: a tiny random llama of mlx-lm's own class
with llama3 ``rope_scaling`` against mlx-lm loading the original folder, on a prompt past the
original context."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf_builders import llama3_gguf_parts, llama3_rope_factors, write_gguf, write_llama3_reference
from mlx_lm.generate import generate_step
from mlx_lm.models.rope_utils import Llama3RoPE

from vllm_mlx_trio.worker.gguf.loader import load_gguf
from vllm_mlx_trio.worker.gguf.rope_factors import FactoredRoPE

pytestmark = pytest.mark.mlx

PROMPT = "The sea was calm, and 42 boats came home.\nThen it rained, and the harbour filled with sails. " * 4
GREEDY_TOKENS = 12


@pytest.fixture(scope="module")
def llama3(tmp_path_factory, demo_dir):
    """(reference folder, GGUF file) of the tiny llama3-scaled model."""
    root = tmp_path_factory.mktemp("llama3")
    reference = write_llama3_reference(root / "reference", demo_dir)
    path = write_gguf(root / "llama3.gguf", *llama3_gguf_parts(reference, demo_dir))
    return reference, path


def logits(model, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids])).astype(mx.float32))[0]


def greedy_tokens(model, ids: list[int]) -> list[int]:
    return [int(token) for token, _ in generate_step(mx.array(ids), model, max_tokens=GREEDY_TOKENS)]


def test_converter_factors_are_mlx_lms_llama3_frequencies(llama3):
    """The factors the converter writes are Llama3RoPE's frequencies over the unscaled ones, and
    the tiny model has pairs left alone, pairs scaled fully and a pair in the smooth band."""
    config = json.loads((llama3[0] / "config.json").read_text())
    factors = llama3_rope_factors(config)
    dims, base, factor = config["head_dim"], config["rope_theta"], config["rope_scaling"]["factor"]
    rope = Llama3RoPE(dims, traditional=True, base=base, scaling_config=config["rope_scaling"])
    unscaled = np.array(base ** (mx.arange(0, dims, 2) / dims))
    np.testing.assert_allclose(factors, np.array(rope._freqs) / unscaled, rtol=1e-6, atol=0)
    assert (factors == 1).any() and (factors == factor).any() and ((factors > 1) & (factors < factor)).any()


def test_f32_file_computes_what_the_original_model_does(llama3, tmp_path):
    reference_dir, path = llama3
    reference, tokenizer = mlx_lm.load(str(reference_dir))
    model, _, _ = load_gguf(str(path), cache_dir=tmp_path)
    assert type(model) is type(reference)
    assert all(isinstance(layer.self_attn.rope, FactoredRoPE) for layer in model.layers)
    ids = tokenizer.encode(PROMPT)
    assert len(ids) > 80  # past the original context of 64
    np.testing.assert_allclose(logits(model, ids), logits(reference, ids), atol=1e-4, rtol=0)
    assert greedy_tokens(model, ids) == greedy_tokens(reference, ids)
