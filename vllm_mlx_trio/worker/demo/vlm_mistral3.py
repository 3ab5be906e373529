"""``demo:vlm-mistral3``: a tiny Mistral 3 (Pixtral vision tower with 2-D RoPE, patch-merging
projector, Mistral text model, 1-D RoPE) with random weights, as ``mlx_vlm.load`` reads a
Mistral Small 3.x checkpoint.

A user turn's image part is one ``[IMG]``; the processor resizes the image to fit
:data:`LONGEST_EDGE` pixels in whole 28-pixel cells (14-pixel patches merged 2x2) and writes one
``[IMG]`` per cell, row by row, with ``[IMG_BREAK]`` between rows and ``[IMG_END]`` last. The
image's features go to its ``[IMG]`` tokens; the break and end tokens keep their embeddings.

Shares the demo corpus, tokenizer, writers and weight recipe with the other VLM demos
(worker/demo/vlm.py). Imports no MLX at module level.
"""

from __future__ import annotations

import pathlib
from typing import Any

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

MISTRAL3_SIZE = "vlm-mistral3"
#: Pixtral (12B's layout): the same tower without the 2x2 patch merger, one token per patch.
PIXTRAL_SIZE = "vlm-pixtral"
IMAGE_TOKEN, IMAGE_BREAK, IMAGE_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"
PATCH_SIZE = 14
SPATIAL_MERGE = 2
#: Images are resized to fit 112 pixels: at most 4x4 merged cells.
LONGEST_EDGE = 112
VISION_SHAPE = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "image_size": LONGEST_EDGE,
    "patch_size": PATCH_SIZE,
}

#: The text demo's ChatML template, an image part rendered as Mistral's ``[IMG]``.
CHAT_TEMPLATE = image_chat_template("[IMG]")


def template_hash() -> str:
    return vlm_template_hash(CHAT_TEMPLATE)


def write_pixtral(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-pixtral`` into ``directory``, the marker last."""
    write_mistral3(directory, seed=seed, dtype=dtype, merge=1)


def write_mistral3(directory: pathlib.Path, *, seed: int, dtype: str, merge: int = SPATIAL_MERGE) -> None:
    """Write every file of ``demo:vlm-mistral3`` (``merge`` 2) or ``demo:vlm-pixtral`` (1) into
    ``directory``, the marker last."""
    size, model_type = (MISTRAL3_SIZE, "mistral3") if merge > 1 else (PIXTRAL_SIZE, "pixtral")
    tokenizer, ids = write_demo_tokenizer(directory, [IMAGE_TOKEN, IMAGE_BREAK, IMAGE_END])
    config = _config(tokenizer.get_vocab_size(), dtype, ids, model_type, merge)
    weights = draw_weights(mlx_vlm_shapes(config), "language_model.model.", seed, files.damped_ids(tokenizer))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_chat_files(directory, ids, CHAT_TEMPLATE)
    processor = {
        "processor_class": "Mistral3Processor" if merge > 1 else "PixtralProcessor",
        "patch_size": PATCH_SIZE,
        "spatial_merge_size": merge,
        "image_token": IMAGE_TOKEN,
        "image_break_token": IMAGE_BREAK,
        "image_end_token": IMAGE_END,
    }
    files.write_json(directory / "preprocessor_config.json", _image_processor_config(processor["processor_class"]))
    files.write_json(directory / "processor_config.json", processor)
    write_marker(directory, size, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(vocab_size: int, dtype: str, ids: dict[str, int], model_type: str, merge: int) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        "model_type": "mistral",
        "head_dim": 16,
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
        "rope_theta": recipe.ROPE_THETA,
        "tie_word_embeddings": True,
    }
    return {
        "model_type": model_type,
        "architectures": ["Mistral3ForConditionalGeneration" if merge > 1 else "LlavaForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION_SHAPE,
        "image_token_index": ids[IMAGE_TOKEN],
        "spatial_merge_size": merge,
        "vision_feature_layer": -1,
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "pad_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _image_processor_config(processor_class: str) -> dict[str, Any]:
    return {
        "image_processor_type": "PixtralImageProcessor",
        "processor_class": processor_class,
        "size": {"longest_edge": LONGEST_EDGE},
        "patch_size": {"height": PATCH_SIZE, "width": PATCH_SIZE},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "resample": 3,
    }
