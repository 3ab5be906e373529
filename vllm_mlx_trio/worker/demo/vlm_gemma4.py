"""``demo:vlm-gemma4``: a tiny Gemma 4 in the shape of its E2B / E4B models (a vision tower with
2-D RoPE over the patches and pooled soft tokens; a text model with sliding-window and global
layers, per-layer inputs, and its last layers reusing earlier layers' KV), with random weights,
as ``mlx_vlm.load`` reads a Gemma 4 checkpoint.

A user turn's image part is one ``<|image|>``; Gemma 4's processor resizes the image keeping its
aspect ratio to at most :data:`MAX_SOFT_TOKENS` pooled cells of 2x2 patches of 16 pixels, and
replaces the placeholder with ``<|image>`` + one ``<|image|>`` per soft token + ``<image|>``.
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

GEMMA4_SIZE = "vlm-gemma4"
BOI, EOI, IMAGE_TOKEN = "<|image>", "<image|>", "<|image|>"
#: At most this many soft tokens an image (2x2-pooled 16-pixel patches: up to 64x64 pixels).
MAX_SOFT_TOKENS = 16
POOLING = 2
PATCH = 16
VISION_SHAPE = {
    "model_type": "gemma4_vision",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 16,
    "patch_size": PATCH,
    "pooling_kernel_size": POOLING,
    "position_embedding_size": 64,
    "default_output_length": MAX_SOFT_TOKENS,
}
#: Four layers: sliding, global, sliding, global (pattern 2); the last two reuse the first two's
#: KV (num_kv_shared_layers), and every layer gets a per-layer input (E2B's layout).
TEXT_EXTRA = {
    "num_hidden_layers": 4,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_key_value_heads": 1,
    "sliding_window": 512,
    "sliding_window_pattern": 2,
    "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 16,
    "final_logit_softcapping": 30.0,
}

#: The text demo's ChatML template, an image part rendered as Gemma 4's ``<|image|>``.
CHAT_TEMPLATE = image_chat_template("<|image|>")


def template_hash() -> str:
    return vlm_template_hash(CHAT_TEMPLATE)


def write_gemma4(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-gemma4`` into ``directory``, the marker last."""
    tokenizer, ids = write_demo_tokenizer(directory, [BOI, EOI, IMAGE_TOKEN])
    config = _config(tokenizer.get_vocab_size(), dtype, ids)
    shapes = mlx_vlm_shapes(config)
    shapes.pop("language_model.lm_head.weight", None)  # tied to the embeddings
    weights = draw_weights(shapes, "language_model.model.", seed, files.damped_ids(tokenizer))
    for name in weights:
        if name.endswith(".layer_scalar"):  # each layer's output scale (draw_weights zeroes 1-D weights)
            weights[name][:] = 1.0
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    extra_special_tokens = {"boi_token": BOI, "eoi_token": EOI, "image_token": IMAGE_TOKEN}
    write_chat_files(directory, ids, CHAT_TEMPLATE, extra_special_tokens=extra_special_tokens)
    files.write_json(directory / "processor_config.json", _processor_config())
    write_marker(directory, GEMMA4_SIZE, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(vocab_size: int, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        **TEXT_EXTRA,
        "model_type": "gemma4_text",
        "vocab_size": vocab_size,
        "vocab_size_per_layer_input": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
    }
    return {
        "model_type": "gemma4",
        "architectures": ["Gemma4ForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION_SHAPE,
        "image_token_id": ids[IMAGE_TOKEN],
        "boi_token_id": ids[BOI],
        "eoi_token_id": ids[EOI],
        "vision_soft_tokens_per_image": MAX_SOFT_TOKENS,
        "hidden_size": TEXT_SHAPE["hidden_size"],
        "vocab_size": vocab_size,
        "pad_token_id": ids[files.ENDOFTEXT],
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _processor_config() -> dict[str, Any]:
    return {
        "processor_class": "Gemma4Processor",
        "image_processor": {
            "image_processor_type": "Gemma4ImageProcessor",
            "patch_size": PATCH,
            "max_soft_tokens": MAX_SOFT_TOKENS,
            "pooling_kernel_size": POOLING,
            "do_resize": True,
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": IMAGE_MEAN,
            "image_std": IMAGE_STD,
        },
    }
