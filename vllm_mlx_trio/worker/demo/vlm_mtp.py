"""``demo:vlm-mtp-tiny``: a tiny Qwen3.5 vision-language model carrying an MTP head that agrees with it often.

``demo:mtp-tiny``'s hybrid text model and constructed MTP head (worker/demo/mtp.py: three Gated DeltaNet layers
then one attention layer, twice; the head predicts the token after next with the target's own token-to-token
function) with ``demo:vlm-qwen3_5``'s vision tower (worker/demo/vlm.py), in the layout of a real Qwen3.5
checkpoint: ``model.language_model.*``, ``model.visual.*``, ``lm_head.weight`` and the top-level ``mtp.*`` block
that ``mlx_vlm.load`` drops and the MTP drafter reads, with the Hugging Face conventions such a checkpoint has
(zero-centred norm weights, ``conv1d`` weights channel-first): mlx-vlm converts any checkpoint under those names as
one, and mlx-lm and the MTP head loader convert it the same way, so the three see the weights mtp-tiny's target and
head have. The tokenizer is mtp-tiny's with the Qwen-VL vision tokens
appended, the chat template and processor files are the Qwen-VL demos'. For the vlm runner with speculation
(worker/vlm/speculative.py). Imports no MLX at module level.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from . import files, mtp, vlm

#: The demo name (``demo:vlm-mtp-tiny``).
VLM_MTP_TINY = "vlm-mtp-tiny"
#: The Qwen3.5 demo whose vision tower and processor files this one shares.
_TOWER_DEMO = vlm.QWEN_VL_DEMOS["vlm-qwen3_5"]


def write_vlm_mtp(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-mtp-tiny`` into ``directory``, the marker last (worker/demo/table.py)."""
    tokenizer, ids = vlm.write_demo_tokenizer(directory, vlm.VISION_TOKENS, mtp.TEXT_CONFIG["vocab_size"])
    config = model_config(tokenizer.get_vocab_size(), dtype, ids)
    weights = hf_layout(mtp.constructed_weights(config, seed, files.damped_ids(tokenizer)))
    weights.update(tower_weights(config, seed))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    vlm.write_chat_files(directory, ids, vlm.CHAT_TEMPLATE)
    files.write_json(directory / "preprocessor_config.json", vlm._image_processor_config(_TOWER_DEMO))
    files.write_json(directory / "video_preprocessor_config.json", vlm._video_processor_config(_TOWER_DEMO))
    files.write_json(directory / "processor_config.json", {"processor_class": _TOWER_DEMO.processor_class})
    vlm.write_marker(directory, VLM_MTP_TINY, seed=seed, dtype=dtype, chat_template=vlm.CHAT_TEMPLATE)


def model_config(vocab_size: int, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """mtp-tiny's ``config.json`` (its text_config over ``vocab_size`` tokens) with the Qwen3.5 demo's vision
    tower and the vision tokens' ids."""
    config = mtp.model_config(dtype, ids)
    config["text_config"] = {**config["text_config"], "vocab_size": vocab_size}
    vision = {**vlm.VISION_SHAPE, **_TOWER_DEMO.vision_extra, "out_hidden_size": mtp.TEXT_CONFIG["hidden_size"]}
    return {
        **config,
        "vocab_size": vocab_size,
        "vision_config": {**vision, "model_type": "qwen3_5"},
        "image_token_id": ids[vlm.IMAGE_PAD],
        "video_token_id": ids[vlm.VIDEO_PAD],
        "vision_start_token_id": ids[vlm.VISION_START],
        "vision_end_token_id": ids[vlm.VISION_END],
    }


#: The target's norms a Hugging Face Qwen3.5 checkpoint stores zero-centred (``w - 1``): mlx-lm's and mlx-vlm's
#: qwen3_5 sanitize add 1 back.
_TARGET_ZERO_CENTRED = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.language_model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)


def hf_layout(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """mtp-tiny's weights (MLX layout) as a Hugging Face checkpoint stores them: the zero-centred norms minus 1
    (the MTP head's as its loader reads them: worker/speculative/mtp/head.py), ``conv1d`` weights (C, 1, K)."""
    from ..speculative.mtp.head import MTP_PREFIX, ZERO_CENTRED_NORMS

    converted = {}
    for name, value in weights.items():
        is_mtp = name.startswith(MTP_PREFIX)
        centred = name.endswith(ZERO_CENTRED_NORMS if is_mtp else _TARGET_ZERO_CENTRED)
        if value.ndim == 1 and centred:
            value = value - np.float32(1.0)
        elif name.endswith("conv1d.weight"):
            value = np.ascontiguousarray(np.moveaxis(value, 2, 1))
        converted[name] = value
    return converted


def tower_weights(config: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
    """The vision tower's float32 weights under the checkpoint's ``model.visual.*`` names, drawn as the Qwen-VL
    demos draw theirs (from their own generator: the text model's weights are mtp-tiny's)."""
    shapes = {
        name.replace("vision_tower.", _TOWER_DEMO.vision_prefix, 1): shape
        for name, shape in vlm.mlx_vlm_shapes(config).items()
        if name.startswith("vision_tower.")
    }
    rng = np.random.default_rng(seed + 1)
    weights = {}
    for name, shape in sorted(shapes.items()):
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight")):
            weights[name] = np.ones(shape, dtype=np.float32)
        elif len(shape) == 1:
            weights[name] = np.zeros(shape, dtype=np.float32)
        else:
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(int(np.prod(shape[1:])) ** -0.5)
    return weights
