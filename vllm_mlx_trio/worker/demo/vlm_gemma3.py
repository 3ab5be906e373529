"""``demo:vlm-gemma3``: a tiny Gemma 3 (SigLIP tower, pooled projector, Gemma 3 text model with
sliding-window and global layers, 1-D RoPE) with random weights, as ``mlx_vlm.load`` reads a
Gemma 3 checkpoint.

A user turn's image part is one ``<start_of_image>``; Gemma 3's processor replaces it with
``\\n\\n<start_of_image>`` + :data:`IMAGE_TOKENS` ``<image_soft_token>`` + ``<end_of_image>\\n\\n``.
The image processor (transformers' Gemma 3 one, PIL backend: no torch) resizes every image to
:data:`IMAGE_SIZE` pixels; the projector pools its 4x4 patches to 2x2 tokens. The head is tied to
the embeddings, as in the released checkpoints (mlx-vlm's sanitize ties it).

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

GEMMA3_SIZE = "vlm-gemma3"
BOI, EOI, IMAGE_TOKEN = "<start_of_image>", "<end_of_image>", "<image_soft_token>"
IMAGE_SIZE = 56
#: 4x4 patches of 14 pixels pooled 2x2: four tokens per image.
IMAGE_TOKENS = 4
VISION_SHAPE = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "patch_size": 14,
    "image_size": IMAGE_SIZE,
}
#: Layer 0 slides over a 512-token window, layer 1 attends globally (pattern 2).
TEXT_EXTRA = {
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 512,
    "sliding_window_pattern": 2,
    "mm_tokens_per_image": IMAGE_TOKENS,
    "rope_local_base_freq": 10_000.0,
    "rope_global_base_freq": recipe.ROPE_THETA,
}

#: The text demo's ChatML template, an image part rendered as Gemma 3's ``<start_of_image>``.
CHAT_TEMPLATE = image_chat_template("<start_of_image>")


def template_hash() -> str:
    return vlm_template_hash(CHAT_TEMPLATE)


def write_gemma3(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-gemma3`` into ``directory``, the marker last."""
    tokenizer, ids = write_demo_tokenizer(directory, [BOI, EOI, IMAGE_TOKEN])
    config = _config(tokenizer.get_vocab_size(), dtype, ids)
    shapes = mlx_vlm_shapes(config)
    del shapes["language_model.lm_head.weight"]  # tied: mlx-vlm's sanitize copies the embeddings
    weights = draw_weights(shapes, "language_model.model.", seed, files.damped_ids(tokenizer))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    extra_special_tokens = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE_TOKEN}
    write_chat_files(directory, ids, CHAT_TEMPLATE, extra_special_tokens=extra_special_tokens)
    files.write_json(directory / "preprocessor_config.json", _image_processor_config())
    files.write_json(
        directory / "processor_config.json", {"processor_class": "Gemma3Processor", "image_seq_length": IMAGE_TOKENS}
    )
    write_marker(directory, GEMMA3_SIZE, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(vocab_size: int, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        **TEXT_EXTRA,
        "model_type": "gemma3_text",
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
    }
    return {
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION_SHAPE,
        "mm_tokens_per_image": IMAGE_TOKENS,
        "image_token_index": ids[IMAGE_TOKEN],
        "boi_token_index": ids[BOI],
        "eoi_token_index": ids[EOI],
        "hidden_size": TEXT_SHAPE["hidden_size"],
        "vocab_size": vocab_size,
        "pad_token_id": ids[files.ENDOFTEXT],
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _image_processor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "do_pan_and_scan": False,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "resample": 2,
        "image_seq_length": IMAGE_TOKENS,
    }
