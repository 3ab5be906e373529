"""The built-in text demo models: real Qwen3-architecture models with random weights.

:func:`write_qwen3_demo` writes a directory in Hugging Face layout (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``, ...) that
``mlx_lm.load`` reads exactly like a downloaded checkpoint.  The tokenizer is a
byte-level BPE trained on the bundled ``data/corpus.txt``; the weights are
drawn from ``numpy.random.default_rng(seed)``.  The same size, seed and dtype
always give byte-identical files. worker/demo/table.py builds ``demo:tiny`` and
``demo:small`` with it, and the speculative pair (worker/demo/spec.py) with its own weights;
bench/gpu_check.py builds the GPU check's Qwen3-0.6B- and Qwen3-8B-shaped models with
:func:`write_qwen3_model` and weights drawn by MLX on its device.

The default stored dtype is bfloat16: on MLX 0.32's Linux CPU wheel float32
matmuls go to a bundled reference BLAS (~1.3 GFLOP/s), so for ``small``
bfloat16 prefills ~2.3x and batch-decodes ~2x faster; float32 only wins a
single decode stream, by ~15%.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from .files import ENDOFTEXT, IM_END, SPECIAL_TOKENS, damped_ids, train_tokenizer, write_json, write_safetensors
from .recipe import (
    DEMO_FORMAT_VERSION,
    DEMO_MARKER,
    EMBED,
    EMBED_STD,
    LOGIT_STD,
    RMS_NORM_EPS,
    ROPE_THETA,
    SPECIAL_ROW_SCALE,
    DemoSize,
    chat_template_hash,
    tokenizer_config,
)

#: ``weights(config, seed, damped_ids)``: float32 weights for a Qwen3 ``config.json``.
WeightDraw = Callable[[dict[str, Any], int, list[int]], dict[str, np.ndarray]]
#: ``save(path, config, seed, damped_ids)``: writes the ``model.safetensors`` of a Qwen3 ``config.json``.
WeightSaver = Callable[[pathlib.Path, dict[str, Any], int, list[int]], None]


def random_weights(config: dict[str, Any], seed: int, damped_ids: list[int]) -> dict[str, np.ndarray]:
    """Float32 weights: normal matrices, constant norms.

    Drawn in sorted-name order from one ``default_rng(seed)`` stream: the
    embedding with std ``EMBED_STD``, other matrices with 1/sqrt(fan_in).
    The embedding rows of ``damped_ids`` are scaled by ``SPECIAL_ROW_SCALE``;
    the embedding is tied, so this also shrinks their logits towards 0.
    Norm weights are 1, except the final norm's, which scales the logits to
    a standard deviation of about ``LOGIT_STD``.
    """
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in sorted(qwen3_parameter_shapes(config).items()):
        if name.endswith("norm.weight"):
            final = name == "model.norm.weight"
            scale = LOGIT_STD / (EMBED_STD * config["hidden_size"] ** 0.5) if final else 1.0
            weights[name] = np.full(shape, scale, dtype=np.float32)
            continue
        std = EMBED_STD if name == EMBED else shape[-1] ** -0.5
        weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights[EMBED][damped_ids] *= np.float32(SPECIAL_ROW_SCALE)
    return weights


def write_qwen3_demo(
    directory: pathlib.Path,
    *,
    size: str,
    shape: DemoSize,
    seed: int,
    dtype: str,
    weights: WeightDraw = random_weights,
) -> None:
    """Write every file of the Qwen3 demo ``size`` of ``shape`` into ``directory``, the marker last."""

    def save(path: pathlib.Path, config: dict[str, Any], seed: int, damped: list[int]) -> None:
        write_safetensors(path, weights(config, seed, damped), dtype)

    write_qwen3_model(directory, size=size, shape=shape, seed=seed, dtype=dtype, save_weights=save)


def write_qwen3_model(
    directory: pathlib.Path,
    *,
    size: str,
    shape: DemoSize,
    seed: int,
    dtype: str,
    save_weights: WeightSaver,
    tie_word_embeddings: bool = True,
) -> None:
    """Write a Qwen3 model of ``shape`` into ``directory``: the demo tokenizer and template, the
    config, ``save_weights``'s ``model.safetensors``, the marker last. Untied embeddings give the
    model an ``lm_head`` of its own (Qwen3-8B's layout)."""
    tokenizer = train_tokenizer(shape.vocab_size)
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
    damped = damped_ids(tokenizer)
    tokenizer_json = tokenizer.to_str(pretty=True) + "\n"
    (directory / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")

    config = {**_model_config(shape, dtype, ids), "tie_word_embeddings": tie_word_embeddings}
    save_weights(directory / "model.safetensors", config, seed, damped)
    write_json(directory / "config.json", config)
    stop = {"eos_token_id": [ids[IM_END], ids[ENDOFTEXT]]}  # both end tokens stop
    generation = {"bos_token_id": ids[ENDOFTEXT], "pad_token_id": ids[ENDOFTEXT], **stop}
    write_json(directory / "generation_config.json", generation)
    write_json(directory / "tokenizer_config.json", tokenizer_config(shape.max_position_embeddings))
    special = {"eos_token": IM_END, "pad_token": ENDOFTEXT}
    write_json(directory / "special_tokens_map.json", special)
    marker = {
        "format_version": DEMO_FORMAT_VERSION,
        "size": size,
        "seed": seed,
        "dtype": dtype,
        "chat_template_sha256": chat_template_hash(),
    }
    write_json(directory / DEMO_MARKER, {**marker, "shape": attrs.asdict(shape)})


def _model_config(spec: DemoSize, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """The ``config.json`` of a Qwen3 model of shape ``spec``."""
    return {
        **attrs.asdict(spec),
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "hidden_act": "silu",
        "initializer_range": EMBED_STD,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "use_cache": True,
        "bos_token_id": ids[ENDOFTEXT],
        "pad_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[IM_END],
    }


def qwen3_parameter_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the parameters of mlx-lm's Qwen3 model for ``config``.

    Building the module only creates lazy arrays (it does advance MLX's global
    random key, as ``mlx_lm.load`` itself does).
    """
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    model = qwen3.Model(qwen3.ModelArgs.from_dict(config))
    return {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}
