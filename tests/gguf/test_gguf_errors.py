"""GGUF files that cannot be served are refused with one GGUFError naming the file and what is
wrong with it, and the server's command line exits with that line."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf_builders import demo_gguf_parts, llama3_gguf_parts, write_gguf, write_llama3_reference

from vllm_mlx_trio.cli import main
from vllm_mlx_trio.errors import ModelLoadError
from vllm_mlx_trio.worker.gguf import GGUFError
from vllm_mlx_trio.worker.gguf.loader import load_gguf

pytestmark = pytest.mark.mlx

#: Bytes per 256-value block of the K-quants written below.
K_QUANT_BLOCK_BYTES = {GGMLQuantizationType.Q4_K: 144, GGMLQuantizationType.Q6_K: 210}
SUPPORTED = "llama, qwen2, qwen3, gemma, gemma2, gemma3"


@pytest.fixture(scope="module")
def qwen3_parts(demo_dir):
    """(metadata, tensors) of the demo's qwen3 GGUF file."""
    return demo_gguf_parts(demo_dir, "qwen3")


@pytest.fixture
def root_logging_kept():
    """The root logger as it was: ``serve`` points it at this test's captured stderr."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level


def load_error(path, tmp_path) -> str:
    """Why loading ``path`` fails: its GGUFError's message after the path it starts with."""
    with pytest.raises(GGUFError) as caught:
        load_gguf(str(path), cache_dir=tmp_path / "sidecars")
    assert isinstance(caught.value, ModelLoadError)
    message = str(caught.value)
    assert message.startswith(f"{path}: ")
    return message.removeprefix(f"{path}: ")


def truncated_copy(source, path):
    """``source`` cut in the middle of its tensor data."""
    data = source.read_bytes()
    data_start = GGUFReader(source).data_offset
    path.write_bytes(data[: data_start + (len(data) - data_start) // 2])
    return path


def arch_renamed(metadata: dict, arch: str) -> dict:
    """``metadata`` with the architecture and its keys renamed to ``arch``."""
    renamed = {key.replace("qwen3.", f"{arch}.", 1): value for key, value in metadata.items()}
    return {**renamed, "general.architecture": arch}


def test_truncated_file(builds, tmp_path):
    path = truncated_copy(builds.gguf("qwen3"), tmp_path / "cut.gguf")
    assert load_error(path, tmp_path).startswith("truncated: ")


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "notes.gguf"
    path.write_text("these are not the weights you are looking for\n")
    assert load_error(path, tmp_path).startswith("not a readable GGUF file")


@pytest.mark.parametrize("kquant", K_QUANT_BLOCK_BYTES, ids=lambda kind: kind.name)
def test_k_quant_tensor(qwen3_parts, tmp_path, kquant):
    metadata, tensors = qwen3_parts
    blocks = np.zeros((2, K_QUANT_BLOCK_BYTES[kquant]), dtype=np.uint8)
    path = write_gguf(tmp_path / "k.gguf", metadata, {**tensors, "output.weight": (kquant, blocks)})
    reason = load_error(path, tmp_path)
    assert reason.startswith(f"quantization {kquant.name} (1 tensors) has no MLX layout")


@pytest.mark.parametrize("arch", ["gemma3n", "phi3"])
def test_unmapped_architecture(qwen3_parts, tmp_path, arch):
    metadata, tensors = qwen3_parts
    path = write_gguf(tmp_path / f"{arch}.gguf", arch_renamed(metadata, arch), tensors)
    reason = load_error(path, tmp_path)
    assert reason == f"architecture {arch!r} is not mapped (supported: {SUPPORTED})"


@pytest.mark.parametrize("model", ["t5", "bert"])
def test_unsupported_tokenizer_model(qwen3_parts, tmp_path, model):
    metadata, tensors = qwen3_parts
    path = write_gguf(tmp_path / f"{model}.gguf", {**metadata, "tokenizer.ggml.model": model}, tensors)
    assert load_error(path, tmp_path) == (
        f"tokenizer model {model!r} is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)"
    )


def test_unknown_pre_tokenizer(qwen3_parts, tmp_path):
    metadata, tensors = qwen3_parts
    path = write_gguf(tmp_path / "pre.gguf", {**metadata, "tokenizer.ggml.pre": "deepseek-llm"}, tensors)
    reason = load_error(path, tmp_path)
    assert reason.startswith("pre-tokenizer 'deepseek-llm' is not mapped") and "llama-bpe" in reason


@pytest.mark.parametrize(
    ("flaw", "reason"),
    [("truncated", "truncated: "), ("gemma3n", "architecture 'gemma3n'")],
    ids=["truncated", "gemma3n"],
)
@pytest.mark.usefixtures("root_logging_kept")
def test_serve_exits_with_one_line_naming_the_file(builds, qwen3_parts, tmp_path, capsys, flaw, reason):
    if flaw == "truncated":
        path = truncated_copy(builds.gguf("qwen3"), tmp_path / "cut.gguf")
    else:
        metadata, tensors = qwen3_parts
        path = write_gguf(tmp_path / "gemma3n.gguf", arch_renamed(metadata, flaw), tensors)
    argv = ["serve", "--set", f"model.path={path}", "--set", "server.port=0"]
    assert main([*argv, "--set", f"model.demo_cache_dir={tmp_path / 'cache'}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-mlx-trio: ") and f"{path}: {reason}" in err[0]


def test_rope_factors_on_another_architecture(qwen3_parts, tmp_path):
    metadata, tensors = qwen3_parts
    factors = np.ones(metadata["qwen3.attention.key_length"] // 2, dtype=np.float32)
    path = write_gguf(tmp_path / "factors.gguf", metadata, {**tensors, "rope_freqs.weight": factors})
    reason = load_error(path, tmp_path)
    assert reason == "architecture 'qwen3' with per-dimension RoPE frequency factors (rope_freqs) is not mapped"


def test_llama_rope_factors_not_one_per_pair(demo_dir, tmp_path):
    metadata, tensors = llama3_gguf_parts(write_llama3_reference(tmp_path / "reference", demo_dir), demo_dir)
    factors = tensors["rope_freqs.weight"]
    path = write_gguf(tmp_path / "short.gguf", metadata, {**tensors, "rope_freqs.weight": factors[:-1]})
    reason = load_error(path, tmp_path)
    pairs = len(factors)
    assert reason == f"rope_freqs.weight of shape ({pairs - 1},) is not mapped (one factor per pair: ({pairs},))"
