"""Gemma GGUF files compute what the original model computes: tiny random gemma, gemma2 and
gemma3_text models of mlx-lm's own classes, written as llama.cpp's converter writes them (its
tensor names and metadata keys, every norm weight plus 1), against mlx-lm loading the original
folder; and the Gemma keys the files leave out or name differently, read as llama.cpp reads them."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf_builders import GEMMA_ARCHITECTURES, gemma_gguf_parts, write_gemma_reference, write_gguf
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

from vllm_mlx_trio.worker.gguf.arch import hf_config
from vllm_mlx_trio.worker.gguf.loader import load_gguf

PROMPT = "The sea was calm, and 42 boats came home.\nThen it rained."
GREEDY_TOKENS = 12
#: Norm weights go through ``(w + 1) - 1`` in float32.
NORM_ROUNDING = 1e-7
TOKENS = {"tokenizer.ggml.tokens": ["a"] * 8}


class GemmaBuilds:
    """Reference folders and GGUF files of the tiny Gemma models, written on first use."""

    def __init__(self, root, demo_dir) -> None:
        self.root = root
        self.demo_dir = demo_dir
        self.sidecars = root / "sidecars"

    def reference(self, arch: str):
        path = self.root / f"reference-{arch}"
        return path if path.is_dir() else write_gemma_reference(path, self.demo_dir, arch)

    def gguf(self, arch: str):
        path = self.root / f"{arch}.gguf"
        if not path.is_file():
            write_gguf(path, *gemma_gguf_parts(self.reference(arch), self.demo_dir, arch))
        return path


@pytest.fixture(scope="module")
def gemma_builds(tmp_path_factory, demo_dir) -> GemmaBuilds:
    return GemmaBuilds(tmp_path_factory.mktemp("gemma"), demo_dir)


def logits(model, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids])).astype(mx.float32))[0]


def greedy_tokens(model, ids: list[int]) -> list[int]:
    return [int(token) for token, _ in generate_step(mx.array(ids), model, max_tokens=GREEDY_TOKENS)]


@pytest.mark.mlx
@pytest.mark.parametrize("arch", GEMMA_ARCHITECTURES)
def test_f32_file_computes_what_the_original_model_does(gemma_builds, arch):
    reference, tokenizer = mlx_lm.load(str(gemma_builds.reference(arch)))
    model, _, config = load_gguf(str(gemma_builds.gguf(arch)), cache_dir=gemma_builds.sidecars)
    assert type(model) is type(reference)
    expected = dict(tree_flatten(reference.parameters()))
    loaded = dict(tree_flatten(model.parameters()))
    assert loaded.keys() == expected.keys()
    for name, array in loaded.items():
        np.testing.assert_allclose(np.array(array), np.array(expected[name]), atol=NORM_ROUNDING, rtol=0, err_msg=name)
    ids = tokenizer.encode(PROMPT)
    if arch == "gemma3":
        assert len(ids) > config["sliding_window"]  # the window leaves out the prompt's start
    np.testing.assert_allclose(logits(model, ids), logits(reference, ids), atol=1e-4, rtol=0)
    assert greedy_tokens(model, ids) == greedy_tokens(reference, ids)


def gemma_file_metadata(arch: str, layers: int = 2, **keys) -> dict:
    """A Gemma file's metadata (64 wide, 4 heads of 32), with ``keys`` under ``<arch>.``."""
    shared = {"block_count": layers, "embedding_length": 64, "feed_forward_length": 128}
    shared |= {"attention.head_count": 4, "attention.head_count_kv": 2, "attention.key_length": 32}
    return {"general.architecture": arch, **TOKENS, **{f"{arch}.{k}": v for k, v in (shared | keys).items()}}


@pytest.mark.parametrize(("arch", "layers", "scalar"), [("gemma2", 46, 16), ("gemma2", 42, 32), ("gemma3", 62, 16)])
def test_queries_are_scaled_as_llama_cpp_scales_them(arch, layers, scalar):
    """Hidden/heads for the 27B models (by their layer count), head_dim for every other size."""
    assert hf_config(gemma_file_metadata(arch, layers), set())["query_pre_attn_scalar"] == scalar


def test_gemma2_without_soft_capping_keys_takes_llama_cpps_defaults():
    config = hf_config(gemma_file_metadata("gemma2"), set())
    assert (config["attn_logit_softcapping"], config["final_logit_softcapping"]) == (50.0, 30.0)


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ({"attention.sliding_window": 512}, {"sliding_window_pattern": 6, "rope_local_base_freq": 10_000.0}),
        ({"attention.sliding_window": 512, "attention.sliding_window_pattern": 4}, {"sliding_window_pattern": 4}),
        (
            {"attention.sliding_window": 512, "attention.sliding_window_pattern": [True, True, False]},
            {"sliding_window_pattern": 3},
        ),
        ({"attention.sliding_window": 512, "rope.freq_base_swa": 20_000.0}, {"rope_local_base_freq": 20_000.0}),
        ({}, {"sliding_window_pattern": 1}),
        (
            {"rope.scaling.type": "linear", "rope.scaling.factor": 8.0},
            {"rope_scaling": {"rope_type": "linear", "factor": 8.0}},
        ),
    ],
    ids=["llama-cpp-period", "period", "per-layer", "local-rope-base", "no-window", "linear-rope"],
)
def test_gemma3_layers_read_as_llama_cpp_reads_them(keys, expected):
    config = hf_config(gemma_file_metadata("gemma3", layers=3, **keys), set())
    assert {key: config[key] for key in expected} == expected


@pytest.mark.parametrize(
    ("arch", "keys", "tensors", "reason"),
    [
        ("gemma", {}, {"output.weight"}, "architecture 'gemma' with its own output.weight is not mapped"),
        ("gemma2", {}, {"output.weight"}, "architecture 'gemma2' with its own output.weight is not mapped"),
        ("gemma3", {"final_logit_softcapping": 30.0}, set(), "architecture 'gemma3' with final_logit_softcapping"),
        ("gemma3", {"rope.scaling.type": "yarn"}, set(), "architecture 'gemma3' with RoPE scaling 'yarn'"),
        ("gemma2", {"rope.scaling.type": "linear"}, set(), "architecture 'gemma2' with RoPE scaling 'linear'"),
        ("gemma", {"rope.dimension_count": 16}, set(), "architecture 'gemma' with RoPE on part of each head"),
        ("gemma2", {"rope.freq_base_swa": 20_000.0}, set(), "architecture 'gemma2' with its own RoPE base"),
        (
            "gemma3",
            {"attention.sliding_window": 8, "attention.sliding_window_pattern": [False, True, True, False]},
            set(),
            "architecture 'gemma3' with sliding-window layers",
        ),
    ],
    ids=[
        "gemma-output",
        "gemma2-output",
        "gemma3-softcap",
        "gemma3-yarn",
        "gemma2-linear",
        "partial-rope",
        "gemma2-local-rope",
        "pattern",
    ],
)
def test_what_mlx_lm_cannot_run_is_refused_with_the_reason(arch, keys, tensors, reason):
    with pytest.raises(KeyError) as refused:
        hf_config(gemma_file_metadata(arch, layers=4, **keys), tensors)
    assert refused.value.args[0].startswith(reason)
