"""``demo:vlm-llava``: a tiny LLaVA (CLIP vision tower, projector, Llama text model, 1-D RoPE)
with random weights, in the layout ``mlx_vlm.load`` reads as a llava-hf checkpoint.

A user turn's image part is one ``<image>`` in the template; LLaVA's processor repeats it once
per vision patch (CLIP's class token dropped: the "default" feature strategy). The image
processor is transformers' CLIP one (PIL backend: no torch): every image is resized and
cropped to :data:`IMAGE_SIZE` pixels, so it always takes :data:`IMAGE_TOKENS` tokens.

Shares the demo corpus, tokenizer, writers and weight recipe with the Qwen-VL demos
(worker/demo/vlm.py). Imports no MLX at module level.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from . import files, recipe
from .vlm import (
    IMAGE_MEAN,
    IMAGE_STD,
    TEXT_SHAPE,
    draw_weights,
    image_chat_template,
    mlx_vlm_shapes,
    write_chat_files,
    write_demo_tokenizer,
    write_marker,
)
from .vlm import template_hash as vlm_template_hash

LLAVA_SIZE = "vlm-llava"
IMAGE_TOKEN = "<image>"
#: CLIP-like tower: 14-pixel patches of a 56x56 image (4x4 = 16 tokens after the class token is dropped).
VISION_SHAPE = {
    "model_type": "clip_vision_model",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "image_size": 56,
    "patch_size": 14,
    "projection_dim": 32,
}
IMAGE_SIZE = VISION_SHAPE["image_size"]
IMAGE_TOKENS = (IMAGE_SIZE // VISION_SHAPE["patch_size"]) ** 2

#: The text demo's ChatML template, an image part rendered as LLaVA's ``<image>``.
CHAT_TEMPLATE = image_chat_template("<image>")


def template_hash() -> str:
    return vlm_template_hash(CHAT_TEMPLATE)


def write_llava(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-llava`` into ``directory``, the marker last."""
    write_llava_family(directory, LlavaVariant(size=LLAVA_SIZE, model_type="llava"), seed=seed, dtype=dtype)


@attrs.frozen
class LlavaVariant:
    """What one LLaVA-family demo changes in the shared layout: its names, and its extras."""

    size: str
    model_type: str
    #: The ``*Processor`` / ``*ForConditionalGeneration`` stem (``Llava``, ``LlavaNext``).
    class_stem: str = "Llava"
    image_processor_type: str = "CLIPImageProcessor"
    #: Keys added to config.json and to preprocessor_config.json.
    extra_config: dict[str, Any] = attrs.field(factory=dict)
    extra_image_processor: dict[str, Any] = attrs.field(factory=dict)
    #: Weights beside the tower and text model, drawn from the seed (name -> draw(seed)).
    extra_weights: Callable[[int], dict[str, np.ndarray]] | None = None


def write_llava_family(directory: pathlib.Path, variant: LlavaVariant, *, seed: int, dtype: str) -> None:
    """Write a LLaVA-family demo (this module's tower, tokenizer and template) into ``directory``."""
    tokenizer, ids = write_demo_tokenizer(directory, [IMAGE_TOKEN])
    config = _config(tokenizer.get_vocab_size(), dtype, ids, variant)
    shapes = mlx_vlm_shapes(config)  # llava-hf checkpoints keep mlx-vlm's names
    weights = draw_weights(shapes, "language_model.model.", seed, files.damped_ids(tokenizer))
    if variant.extra_weights is not None:
        weights.update(variant.extra_weights(seed))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_chat_files(directory, ids, CHAT_TEMPLATE)
    files.write_json(directory / "preprocessor_config.json", _image_processor_config(variant))
    processor = {
        "processor_class": f"{variant.class_stem}Processor",
        "patch_size": VISION_SHAPE["patch_size"],
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "image_token": IMAGE_TOKEN,
    }
    files.write_json(directory / "processor_config.json", processor)
    write_marker(directory, variant.size, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(vocab_size: int, dtype: str, ids: dict[str, int], variant: LlavaVariant) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        "model_type": "llama",
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
        "rope_theta": recipe.ROPE_THETA,
        "tie_word_embeddings": True,
    }
    return {
        "model_type": variant.model_type,
        "architectures": [f"{variant.class_stem}ForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION_SHAPE,
        "image_token_index": ids[IMAGE_TOKEN],
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "projector_hidden_act": "gelu",
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "pad_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
        **variant.extra_config,
    }


def _image_processor_config(variant: LlavaVariant) -> dict[str, Any]:
    return {
        "image_processor_type": variant.image_processor_type,
        "processor_class": f"{variant.class_stem}Processor",
        "size": {"shortest_edge": IMAGE_SIZE},
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_resize": True,
        "do_center_crop": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "resample": 3,
        **variant.extra_image_processor,
    }
