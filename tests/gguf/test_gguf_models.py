"""GGUF files of the demo compute what the original model computes: F32 files of llama, qwen2 and
qwen3 against mlx-lm's own model, packed Q8_0/Q4_0/Q4_1 layers against gguf's dequantization of
the file's blocks, and the dequantized (float32) model against both."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize
from gguf_builders import ARCHITECTURES, gguf_name
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step

from vllm_mlx_trio.worker.gguf.loader import load_gguf

pytestmark = pytest.mark.mlx

Q = GGMLQuantizationType
PROMPT = "The sea was calm, and 42 boats came home.\nThen it rained."
GREEDY_TOKENS = 12
#: Bits MLX packs each GGUF block format in (group size 32).
PACKED_BITS = {Q.Q8_0: 8, Q.Q4_0: 4, Q.Q4_1: 4}
#: mx.dequantize of a packed layer computes in its float16 scales' precision.
FLOAT16_WEIGHT_ATOL = 1e-3
#: Packed matmuls against float32 ones, on logits of standard deviation ~3.
PACKED_LOGITS_ATOL = 0.1


def logits(model, ids: list[int]) -> np.ndarray:
    return np.array(model(mx.array([ids])).astype(mx.float32))[0]


def greedy_tokens(model, ids: list[int]) -> list[int]:
    return [int(token) for token, _ in generate_step(mx.array(ids), model, max_tokens=GREEDY_TOKENS)]


def file_values(path) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF file as gguf's own reader and dequantization give it."""
    return {t.name: dequantize(t.data, t.tensor_type) for t in GGUFReader(path).tensors}


def packed_modules(model) -> dict[str, nn.Module]:
    kinds = (nn.QuantizedLinear, nn.QuantizedEmbedding)
    return {name: module for name, module in model.named_modules() if isinstance(module, kinds)}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_f32_file_computes_what_the_original_model_does(builds, arch):
    reference, reference_tokenizer = mlx_lm.load(str(builds.reference(arch)))
    model, _, config = load_gguf(str(builds.gguf(arch)), cache_dir=builds.sidecars)
    assert type(model) is type(reference)
    assert config["rope_traditional"] is (arch == "llama")
    ids = reference_tokenizer.encode(PROMPT)
    np.testing.assert_allclose(logits(model, ids), logits(reference, ids), atol=1e-4, rtol=0)
    assert greedy_tokens(model, ids) == greedy_tokens(reference, ids)


@pytest.mark.parametrize("qtype", PACKED_BITS, ids=lambda qtype: qtype.name)
def test_packed_layers_hold_the_files_blocks(builds, qtype):
    path = builds.gguf("qwen3", qtype)
    model, _, _ = load_gguf(str(path), cache_dir=builds.sidecars)
    blocks = {name: values for name, values in file_values(path).items() if name.endswith(".weight")}
    packed = packed_modules(model)
    quantized_in_file = {t.name for t in GGUFReader(path).tensors if t.tensor_type == qtype}
    assert {gguf_name(f"{name}.weight") for name in packed} == quantized_in_file
    for name, module in packed.items():
        assert (module.bits, module.group_size, module.mode) == (PACKED_BITS[qtype], 32, "affine")
        weight = mx.dequantize(module.weight, module.scales, module.biases, group_size=32, bits=module.bits)
        expected = blocks[gguf_name(f"{name}.weight")]
        np.testing.assert_allclose(np.array(weight.astype(mx.float32)), expected, atol=FLOAT16_WEIGHT_ATOL, rtol=0)


@pytest.mark.parametrize("qtype", PACKED_BITS, ids=lambda qtype: qtype.name)
def test_float32_dequantizes_to_the_files_values(builds, qtype):
    path = builds.gguf("qwen3", qtype)
    reference, reference_tokenizer = mlx_lm.load(str(builds.reference("qwen3", qtype)))
    plain, _, _ = load_gguf(str(path), dtype="float32", cache_dir=builds.sidecars)
    packed, _, _ = load_gguf(str(path), cache_dir=builds.sidecars)
    assert not packed_modules(plain)
    assert {array.dtype for _, array in tree_flatten(plain.parameters())} == {mx.float32}
    ids = reference_tokenizer.encode(PROMPT)
    np.testing.assert_allclose(logits(plain, ids), logits(reference, ids), atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits(packed, ids), logits(plain, ids), atol=PACKED_LOGITS_ATOL, rtol=0)


@pytest.mark.parametrize(("qtype", "dtype"), [(Q.F16, mx.float16), (Q.BF16, mx.bfloat16)], ids=["F16", "BF16"])
def test_half_precision_files_keep_their_values_and_dtype(builds, qtype, dtype):
    path = builds.gguf("qwen3", qtype)
    model, _, _ = load_gguf(str(path), cache_dir=builds.sidecars)
    stored = file_values(path)
    for name, array in tree_flatten(model.parameters()):
        assert array.dtype == (dtype if array.ndim == 2 else mx.float32), name
        np.testing.assert_array_equal(np.array(array.astype(mx.float32)), stored[gguf_name(name)], err_msg=name)


def test_a_directory_holding_one_file_loads_that_file(builds, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "qwen3.gguf").symlink_to(builds.gguf("qwen3"))
    model, tokenizer, _ = load_gguf(str(folder), cache_dir=builds.sidecars)
    direct, _, _ = load_gguf(str(builds.gguf("qwen3")), cache_dir=builds.sidecars)
    ids = tokenizer.encode(PROMPT)
    np.testing.assert_array_equal(logits(model, ids), logits(direct, ids))
