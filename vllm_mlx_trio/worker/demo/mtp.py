"""``demo:mtp-tiny``: a tiny hybrid Qwen3.5-shaped target carrying an MTP head that agrees with it often.

The target is mlx-lm's ``qwen3_5`` architecture: eight layers, three GatedDeltaNet linear-attention layers then one
gated full-attention layer, twice, as Qwen3.5 interleaves them (hidden size 64). It is stored in the layout of a
real Qwen3.5 checkpoint: ``model.language_model.*`` and ``lm_head.weight`` beside the top-level ``mtp.*`` block
(``mtp.fc``, ``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``, ``mtp.norm``) that
``mlx_lm.load`` drops and the MTP drafter (worker/speculative/mtp/drafter.py) reads.

Agreement is constructed, not trained (build time stays well under a second): the target's layers write into the
residual stream with small output projections (``LAYER_OUTPUT_SCALE``), so its next token is mostly a function of
the current token through the untied head; the MTP head's ``fc`` passes the normed embedding of the next token
through (plus a small share of the hidden state) and its own layer is damped further, so it predicts the token
after next with the same function. Where the target's layers tip the argmax the two disagree: acceptance is high but
not 1, which exercises both accepted and rejected drafts.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from . import files, recipe

#: The demo name (``demo:mtp-tiny``).
MTP_TINY = "mtp-tiny"
#: Bump when the recipe changes; recorded in the marker.
MTP_RECIPE_VERSION = 1
#: Scale of the output projections (attention ``o_proj``, linear-attention ``out_proj``, MLP ``down_proj``) of the
#: target's and the MTP head's layers, relative to 1/sqrt(fan_in): small enough that the residual stream keeps the
#: token's embedding on top (so the MTP head can predict the target), large enough that the layers matter and the
#: head sometimes disagrees (measured on this build: greedy acceptance ~0.85 at 1 draft, ~0.7 at 3).
LAYER_OUTPUT_SCALE = 0.07
#: The same for the MTP head's own layer: it stays close to the identity, so the head predicts with the target's
#: token-to-token function.
MTP_LAYER_OUTPUT_SCALE = 0.1
#: Share of the hidden state in the MTP head's ``fc`` (the embedding half is the identity).
MTP_HIDDEN_SHARE = 0.05
_OUTPUT_PROJECTIONS = ("o_proj.weight", "out_proj.weight", "down_proj.weight")
#: Parameters that start at 1: every norm (the MTP head's two input norms too) and the delta net's ``dt_bias``.
_UNIT_WEIGHTS = ("norm.weight", "norm_embedding.weight", "norm_hidden.weight", "dt_bias")

#: The text_config of the target (Qwen3.5 field names; mlx-lm's qwen3_5 ``TextModelArgs`` reads them).
TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "full_attention_interval": 4,  # as Qwen3.5: 3 linear-attention layers, then attention
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": recipe.RMS_NORM_EPS,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 1_000_000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
    },
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "mtp_num_hidden_layers": 1,
}


def write_mtp_tiny(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:mtp-tiny`` into ``directory``, the marker last (worker/demo/table.py's writer)."""
    tokenizer, ids = tokenizer_and_ids(TEXT_CONFIG["vocab_size"])
    config = model_config(dtype, ids)
    weights = constructed_weights(config, seed, files.damped_ids(tokenizer))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_tokenizer_side(directory, tokenizer, ids, TEXT_CONFIG["max_position_embeddings"])
    write_marker(directory, size=MTP_TINY, seed=seed, dtype=dtype, recipe_version=MTP_RECIPE_VERSION)


def tokenizer_and_ids(vocab_size: int) -> tuple[Any, dict[str, int]]:
    """The demo tokenizer trained to ``vocab_size``, and its special tokens' ids."""
    tokenizer = files.train_tokenizer(vocab_size)
    return tokenizer, {token: tokenizer.token_to_id(token) for token in files.SPECIAL_TOKENS}


def write_tokenizer_side(directory: pathlib.Path, tokenizer: Any, ids: dict[str, int], max_length: int) -> None:
    """An MTP demo's tokenizer files and generation config (the other demos' chat template and stop tokens);
    ``max_length``: the tokenizer's ``model_max_length``."""
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    stop = {"eos_token_id": [ids[files.IM_END], ids[files.ENDOFTEXT]]}
    files.write_json(directory / "generation_config.json", {"bos_token_id": ids[files.ENDOFTEXT], **stop})
    files.write_json(directory / "tokenizer_config.json", recipe.tokenizer_config(max_length))
    files.write_json(directory / "special_tokens_map.json", {"eos_token": files.IM_END, "pad_token": files.ENDOFTEXT})


def write_marker(directory: pathlib.Path, *, size: str, seed: int, dtype: str, recipe_version: int) -> None:
    """The demo's marker, written last: what it was built from (checked before a cached build is reused)."""
    marker = {
        "format_version": recipe.DEMO_FORMAT_VERSION,
        "size": size,
        "seed": seed,
        "dtype": dtype,
        "chat_template_sha256": recipe.chat_template_hash(),
        "mtp_recipe_version": recipe_version,
    }
    files.write_json(directory / recipe.DEMO_MARKER, marker)


def model_config(dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """``config.json``: a Qwen3.5 conditional-generation config whose text_config is the target (no vision tower)."""
    text = {**TEXT_CONFIG, "eos_token_id": ids[files.IM_END], "torch_dtype": dtype}
    return {
        "model_type": "qwen3_5",
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": text,
        "tie_word_embeddings": False,
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
        "pad_token_id": ids[files.ENDOFTEXT],
    }


def checkpoint_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint names and shapes: mlx-lm's qwen3_5 target renamed to the HF layout, plus the ``mtp.*`` block."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3_5

    from ..speculative.mtp.head import mtp_head_for

    target = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    shapes = {}
    for name, p in tree_flatten(target.parameters()):
        name = name.replace("language_model.model.", "model.language_model.")
        name = name.replace("language_model.lm_head", "lm_head")
        shapes[name] = tuple(p.shape)
    head = mtp_head_for(config["text_config"])
    shapes.update({f"mtp.{name}": tuple(p.shape) for name, p in tree_flatten(head.parameters())})
    return shapes


def constructed_weights(config: dict[str, Any], seed: int, damped_ids: list[int]) -> dict[str, np.ndarray]:
    """Float32 weights drawn in sorted-name order from ``default_rng(seed)``, shaped as the module docstring says."""
    text = config["text_config"]
    hidden = text["hidden_size"]
    logit_scale = recipe.LOGIT_STD  # rows of lm_head have unit norm in expectation: logits std ~ the final norm weight
    rng = np.random.default_rng(seed)
    weights: dict[str, np.ndarray] = {}
    for name, shape in sorted(checkpoint_shapes(config).items()):
        if name.endswith("A_log"):
            weights[name] = np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
        elif name.endswith(_UNIT_WEIGHTS):
            final = name in ("model.language_model.norm.weight", "mtp.norm.weight")
            weights[name] = np.full(shape, logit_scale if final else 1.0, dtype=np.float32)
        elif name == "model.language_model.embed_tokens.weight":
            weights[name] = rng.standard_normal(shape, dtype=np.float32)
        else:
            std = shape[-1] ** -0.5 if not name.endswith("conv1d.weight") else 0.5
            if name.endswith(_OUTPUT_PROJECTIONS):
                std *= MTP_LAYER_OUTPUT_SCALE if name.startswith("mtp.") else LAYER_OUTPUT_SCALE
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights["lm_head.weight"][damped_ids] *= np.float32(recipe.SPECIAL_ROW_SCALE)
    fc = weights["mtp.fc.weight"]  # (hidden, 2 * hidden): [embedding half | hidden half]
    fc[:, :hidden] = np.eye(hidden, dtype=np.float32)
    fc[:, hidden:] *= np.float32(MTP_HIDDEN_SHARE)
    return weights
