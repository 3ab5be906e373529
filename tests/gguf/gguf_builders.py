"""GGUF files written from the tiny demo model, as llama.cpp's converter writes them, and the
mlx-lm folders they must equal.

The demo is a Qwen3 model; a ``llama`` variant drops its q/k norms and a ``qwen2`` variant adds
q/k/v biases. Each variant is written twice: as an mlx-lm folder (Hugging Face names and layout:
the reference) and as a GGUF file (llama.cpp's names; llama's q/k rows permuted as
convert_hf_to_gguf.py's ``LlamaModel.permute`` does).
"""

from __future__ import annotations

import json
import pathlib
import shutil
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import dequantize, quantize

ARCHITECTURES = ("llama", "qwen2", "qwen3")

#: mlx-lm name under ``model.layers.N.`` -> llama.cpp's block tensor name.
BLOCK_TENSORS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
TOP_TENSORS = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
BIAS_STD = 0.05


def load_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """A float32 safetensors file as numpy arrays."""
    import mlx.core as mx

    return {name: np.array(array.astype(mx.float32)) for name, array in mx.load(str(path)).items()}


def variant_weights(demo: dict[str, np.ndarray], arch: str, seed: int = 1) -> dict[str, np.ndarray]:
    """The demo's Qwen3 weights made into a model of ``arch`` (mlx-lm names)."""
    if arch == "qwen3":
        return dict(demo)
    weights = {name: array for name, array in demo.items() if not name.endswith(("q_norm.weight", "k_norm.weight"))}
    if arch == "qwen2":
        rng = np.random.default_rng(seed)
        for name in sorted(demo):
            if name.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                rows = demo[name].shape[0]
                bias = rng.standard_normal(rows, dtype=np.float32) * np.float32(BIAS_STD)
                weights[name.removesuffix("weight") + "bias"] = bias
    return weights


def variant_config(demo_config: dict[str, Any], arch: str) -> dict[str, Any]:
    """The demo's config.json for a model of ``arch``."""
    return {**demo_config, "model_type": arch, "architectures": [], "attention_bias": arch == "qwen2"}


def write_reference(
    out_dir: pathlib.Path,
    demo_dir: pathlib.Path,
    arch: str,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
) -> pathlib.Path:
    """An mlx-lm folder holding the demo as a model of ``arch`` (the demo's own tokenizer), its
    matrices the values a GGUF file of ``qtype`` stores (gguf's own numpy quantization)."""
    import mlx.core as mx

    out_dir.mkdir(parents=True)
    config = variant_config(json.loads((demo_dir / "config.json").read_text()), arch)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    weights = variant_weights(load_safetensors(demo_dir / "model.safetensors"), arch)
    stored = {name: stored_values(array, qtype) for name, array in weights.items()}
    mx.save_safetensors(str(out_dir / "model.safetensors"), {k: mx.array(v) for k, v in stored.items()})
    for name in TOKENIZER_FILES:
        shutil.copy(demo_dir / name, out_dir / name)
    return out_dir


def stored_values(array: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """What a GGUF file of ``qtype`` holds for ``array``, as float32 (vectors stay F32)."""
    if array.ndim != 2:
        return array
    return dequantize(quantize(array, qtype), qtype).astype(np.float32)


def gguf_name(mlx_name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight``."""
    module, leaf = mlx_name.rsplit(".", 1)
    if module in TOP_TENSORS:
        return f"{TOP_TENSORS[module]}.{leaf}"
    _, _, index, part = module.split(".", 3)
    return f"blk.{index}.{BLOCK_TENSORS[part]}.{leaf}"


def permute_for_llama_cpp(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The q/k row order llama.cpp's converter writes for llama (its interleaved RoPE)."""
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def gguf_tensors(weights: dict[str, np.ndarray], config: dict[str, Any], arch: str) -> dict[str, np.ndarray]:
    """``weights`` (mlx-lm names) under llama.cpp's names, llama's q/k permuted."""
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    tensors = {}
    for name, array in weights.items():
        projection = name.split(".")[-2]
        if arch == "llama" and projection in heads:
            array = permute_for_llama_cpp(array, heads[projection])
        tensors[gguf_name(name)] = array
    return tensors


def tokenizer_metadata(tokenizer_dir: pathlib.Path, pre: str = "gpt-2") -> dict[str, Any]:
    """``tokenizer.*`` keys of a byte-level BPE ``tokenizer.json`` and its chat template."""
    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    template = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())["chat_template"]
    vocab = tokenizer["model"]["vocab"]
    special = {token["id"] for token in tokenizer["added_tokens"] if token["special"]}
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = [" ".join(merge) if isinstance(merge, list) else merge for merge in tokenizer["model"]["merges"]]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [
            int(TokenType.CONTROL if index in special else TokenType.NORMAL) for index in range(len(tokens))
        ],
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": vocab["<|im_end|>"],
        "tokenizer.chat_template": template,
    }


def model_metadata(config: dict[str, Any], arch: str) -> dict[str, Any]:
    """``general.architecture`` and the ``<arch>.*`` keys of ``config``."""
    keys = {
        "block_count": config["num_hidden_layers"],
        "embedding_length": config["hidden_size"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config["num_key_value_heads"],
        "attention.key_length": config["head_dim"],
        "attention.value_length": config["head_dim"],
        "attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "rope.freq_base": float(config["rope_theta"]),
        "context_length": config["max_position_embeddings"],
        "vocab_size": config["vocab_size"],
    }
    return {"general.architecture": arch, **{f"{arch}.{key}": value for key, value in keys.items()}}


def write_gguf(
    path: pathlib.Path,
    metadata: dict[str, Any],
    tensors: dict[str, np.ndarray],
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
) -> pathlib.Path:
    """A GGUF file of ``metadata`` and ``tensors``: matrices stored as ``qtype``, vectors as F32
    (as llama.cpp stores norms and biases); a uint8 tensor given as ``(type, bytes)`` as is."""
    writer = GGUFWriter(path, str(metadata["general.architecture"]))
    for key, value in metadata.items():
        if key != "general.architecture":
            _add_value(writer, key, value)
    for name, array in tensors.items():
        _add_tensor(writer, name, array, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_value(writer: GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def _add_tensor(writer: GGUFWriter, name: str, array: Any, qtype: GGMLQuantizationType) -> None:
    if isinstance(array, tuple):
        raw_type, raw = array
        writer.add_tensor(name, raw, raw_dtype=raw_type)
    elif array.ndim == 2 and qtype != GGMLQuantizationType.F32:
        writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, array.astype(np.float32))


def demo_gguf_parts(demo_dir: pathlib.Path, arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, tensors) of the demo as a GGUF file of ``arch``, to write or to alter first."""
    config = variant_config(json.loads((demo_dir / "config.json").read_text()), arch)
    weights = variant_weights(load_safetensors(demo_dir / "model.safetensors"), arch)
    metadata = {**model_metadata(config, arch), **tokenizer_metadata(demo_dir)}
    return metadata, gguf_tensors(weights, config, arch)


def build_gguf(
    path: pathlib.Path,
    demo_dir: pathlib.Path,
    arch: str,
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
) -> pathlib.Path:
    """The demo as a GGUF file of ``arch``, every matrix stored as ``qtype``."""
    metadata, tensors = demo_gguf_parts(demo_dir, arch)
    return write_gguf(path, metadata, tensors, qtype)


# Gemma: tiny random models of mlx-lm's own gemma, gemma2 and gemma3_text classes (the demo's
# tokenizer and vocabulary), and the GGUF files llama.cpp's converter writes for them.

#: GGUF architecture -> mlx-lm ``model_type`` of the reference.
GEMMA_MODEL_TYPES = {"gemma": "gemma", "gemma2": "gemma2", "gemma3": "gemma3_text"}
GEMMA_ARCHITECTURES = tuple(GEMMA_MODEL_TYPES)
#: Spread of the random norm weights (mlx-lm starts them at 0, which the +1 would hide).
NORM_STD = 0.2


def tiny_config(demo_dir: pathlib.Path, model_type: str, **keys: Any) -> dict[str, Any]:
    """config.json of a tiny ``model_type`` model on the demo's width and vocabulary: two layers,
    four heads over two KV heads, head_dim 32 (unlike hidden/heads), tied output; ``keys`` added."""
    demo = json.loads((demo_dir / "config.json").read_text())
    return {
        "model_type": model_type,
        "architectures": [],
        "hidden_size": demo["hidden_size"],
        "num_hidden_layers": 2,
        "intermediate_size": demo["intermediate_size"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "vocab_size": demo["vocab_size"],
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        **keys,
    }


def gemma_config(demo_dir: pathlib.Path, arch: str) -> dict[str, Any]:
    """config.json of a tiny ``arch`` model: the demo's width and vocabulary, head_dim unlike
    hidden/heads; gemma2 with its soft-capping, gemma3 with six layers (five sliding-window
    layers with their own RoPE base, one global layer with linear RoPE scaling)."""
    config = tiny_config(demo_dir, GEMMA_MODEL_TYPES[arch], rms_norm_eps=1e-6, rope_theta=10_000.0)
    if arch == "gemma2":
        config.update(attn_logit_softcapping=2.0, final_logit_softcapping=5.0, query_pre_attn_scalar=32)
        config.update(sliding_window=4096)
    if arch == "gemma3":
        config.update(num_hidden_layers=6, rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
        config.update(query_pre_attn_scalar=32, sliding_window=8, sliding_window_pattern=6)
        config["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    return config


def gemma_reference_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """mlx-lm's own random initialization of the model, norms drawn around 0, the output tied."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, array in tree_flatten(model.parameters()):
        if name == "lm_head.weight":
            continue
        values = np.array(array.astype(mx.float32))
        if name.endswith("norm.weight"):
            values = rng.standard_normal(values.shape).astype(np.float32) * np.float32(NORM_STD)
        weights[name] = values
    return weights


def write_gemma_reference(out_dir: pathlib.Path, demo_dir: pathlib.Path, arch: str) -> pathlib.Path:
    """An mlx-lm folder holding a tiny random ``arch`` model and the demo's tokenizer."""
    return write_random_reference(out_dir, demo_dir, gemma_config(demo_dir, arch))


def write_random_reference(out_dir: pathlib.Path, demo_dir: pathlib.Path, config: dict[str, Any]) -> pathlib.Path:
    """An mlx-lm folder: ``config``, mlx-lm's own random weights for it, the demo's tokenizer."""
    import mlx.core as mx

    out_dir.mkdir(parents=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    weights = gemma_reference_weights(config)
    mx.save_safetensors(str(out_dir / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    for name in TOKENIZER_FILES:
        shutil.copy(demo_dir / name, out_dir / name)
    return out_dir


def gemma_metadata(config: dict[str, Any], arch: str) -> dict[str, Any]:
    """The ``<arch>.*`` keys convert_hf_to_gguf.py writes: no RoPE base for gemma and gemma2;
    soft-capping and window for gemma2; global and local RoPE bases, linear scaling and the
    window for gemma3 (no sliding-window period: llama.cpp's is 6)."""
    keys: dict[str, Any] = {
        "context_length": config["max_position_embeddings"],
        "embedding_length": config["hidden_size"],
        "block_count": config["num_hidden_layers"],
        "feed_forward_length": config["intermediate_size"],
        "attention.head_count": config["num_attention_heads"],
        "attention.head_count_kv": config["num_key_value_heads"],
        "attention.layer_norm_rms_epsilon": float(config["rms_norm_eps"]),
        "attention.key_length": config["head_dim"],
        "attention.value_length": config["head_dim"],
    }
    if arch == "gemma2":
        keys["attn_logit_softcapping"] = float(config["attn_logit_softcapping"])
        keys["final_logit_softcapping"] = float(config["final_logit_softcapping"])
        keys["attention.sliding_window"] = config["sliding_window"]
    if arch == "gemma3":
        keys["rope.freq_base"] = float(config["rope_theta"])
        keys["rope.freq_base_swa"] = float(config["rope_local_base_freq"])
        keys["rope.scaling.type"] = "linear"
        keys["rope.scaling.factor"] = float(config["rope_scaling"]["factor"])
        keys["attention.sliding_window"] = config["sliding_window"]
    return {"general.architecture": arch, **{f"{arch}.{key}": value for key, value in keys.items()}}


def gemma_gguf_tensors(weights: dict[str, np.ndarray], arch: str, layers: int) -> dict[str, np.ndarray]:
    """``weights`` under the names gguf's own tensor map gives them, every norm weight plus 1
    (as convert_hf_to_gguf.py's Gemma models write them)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    model_arch = next(key for key, name in MODEL_ARCH_NAMES.items() if name == arch)
    names = get_tensor_name_map(model_arch, layers)
    tensors = {}
    for name, array in weights.items():
        module, leaf = name.rsplit(".", 1)
        shifted = array + np.float32(1.0) if name.endswith("norm.weight") else array
        tensors[f"{names.get_name(module)}.{leaf}"] = shifted
    return tensors


def gemma_gguf_parts(reference_dir: pathlib.Path, demo_dir: pathlib.Path, arch: str) -> tuple[dict, dict]:
    """(metadata, tensors) of the reference model as a GGUF file of ``arch``."""
    config = json.loads((reference_dir / "config.json").read_text())
    weights = load_safetensors(reference_dir / "model.safetensors")
    metadata = {**gemma_metadata(config, arch), **tokenizer_metadata(demo_dir)}
    return metadata, gemma_gguf_tensors(weights, arch, config["num_hidden_layers"])


# Llama 3 RoPE scaling: a tiny random llama of mlx-lm's own class with llama3 ``rope_scaling``,
# and the GGUF file llama.cpp's converter writes for it (the scaling as ``rope_freqs.weight``).

#: Llama 3.1's RoPE scaling, its original context cut to 64 so that the tiny model's
#: frequencies fall on both sides of the smooth band and in it.
LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def llama3_config(demo_dir: pathlib.Path) -> dict[str, Any]:
    """config.json of a tiny llama with Llama 3's RoPE base and scaling (head_dim 32, four
    heads on the demo's width); ``original_max_position_embeddings`` also at the top, where
    llama.cpp's converter reads it."""
    return tiny_config(
        demo_dir,
        "llama",
        rms_norm_eps=1e-5,
        rope_theta=500_000.0,
        original_max_position_embeddings=LLAMA3_ROPE_SCALING["original_max_position_embeddings"],
        rope_scaling=dict(LLAMA3_ROPE_SCALING),
    )


def write_llama3_reference(out_dir: pathlib.Path, demo_dir: pathlib.Path) -> pathlib.Path:
    """An mlx-lm folder holding the tiny llama3-scaled model and the demo's tokenizer."""
    return write_random_reference(out_dir, demo_dir, llama3_config(demo_dir))


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """``rope_freqs.weight`` by convert_hf_to_gguf.py's rule (``LlamaModel.generate_extra_tensors``):
    per pair of head dimensions, 1 for wavelengths under ``original / high_freq_factor``,
    ``factor`` over ``original / low_freq_factor``, a smooth blend between (float32 base
    frequencies, Python floats per entry)."""
    import math

    scaling, dim = config["rope_scaling"], config["head_dim"]
    base = np.float32(config["rope_theta"])
    freqs = np.float32(1.0) / (base ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = config.get("original_max_position_embeddings", 8192)
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < original / high:
            factors.append(1)
        elif wavelen > original / low:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def llama3_gguf_parts(reference_dir: pathlib.Path, demo_dir: pathlib.Path) -> tuple[dict, dict]:
    """(metadata, tensors) of the llama3-scaled reference as llama.cpp's converter writes it:
    q/k permuted, no RoPE scaling keys, the factors as ``rope_freqs.weight``."""
    config = json.loads((reference_dir / "config.json").read_text())
    weights = load_safetensors(reference_dir / "model.safetensors")
    metadata = {**model_metadata(config, "llama"), **tokenizer_metadata(demo_dir)}
    metadata["llama.rope.dimension_count"] = config["head_dim"]
    tensors = {**gguf_tensors(weights, config, "llama"), "rope_freqs.weight": llama3_rope_factors(config)}
    return metadata, tensors
