"""``demo:vlm-smolvlm``: a tiny SmolVLM (Idefics3 layout: SigLIP-like tower, pixel-shuffle
connector, Llama text model, 1-D RoPE) with random weights, as ``mlx_vlm.load`` reads a SmolVLM
checkpoint.

A user turn's image part is one ``<image>``; the processor splits the image into tiles of
:data:`TILE` pixels (at most :data:`LONGEST_EDGE` pixels on its long side) plus a global view
and writes, per tile, ``<fake_token_around_image><row_r_col_c>`` + :data:`TILE_TOKENS`
``<image>``, a newline after each row of tiles, then the global view's
``<fake_token_around_image><global-img>`` + ``<image>`` run + ``<fake_token_around_image>``.
The image's features go to its ``<image>`` tokens; the markers between keep their embeddings.

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

SMOLVLM_SIZE = "vlm-smolvlm"
#: Idefics3 (SmolVLM's first release, Idefics3-8B): the same layout under its own names.
IDEFICS3_SIZE = "vlm-idefics3"
IMAGE_TOKEN, FAKE_TOKEN, GLOBAL_TOKEN = "<image>", "<fake_token_around_image>", "<global-img>"
#: Tiles of 56x56 pixels: 4x4 patches of 14, pixel-shuffled 2x2 into 4 tokens.
TILE = 56
TILE_TOKENS = 4
LONGEST_EDGE = 112
MAX_TILES_PER_SIDE = LONGEST_EDGE // TILE
ROW_COL_TOKENS = tuple(
    f"<row_{r}_col_{c}>" for r in range(1, MAX_TILES_PER_SIDE + 1) for c in range(1, MAX_TILES_PER_SIDE + 1)
)
VISION_SHAPE = {
    "model_type": "smolvlm_vision",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 2,
    "patch_size": 14,
    "image_size": TILE,
}

#: The text demo's ChatML template, an image part rendered as SmolVLM's ``<image>``.
CHAT_TEMPLATE = image_chat_template("<image>")


def template_hash() -> str:
    return vlm_template_hash(CHAT_TEMPLATE)


def write_idefics3(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-idefics3`` into ``directory``, the marker last."""
    write_smolvlm(directory, seed=seed, dtype=dtype, family="idefics3")


def write_smolvlm(directory: pathlib.Path, *, seed: int, dtype: str, family: str = "smolvlm") -> None:
    """Write every file of ``demo:vlm-smolvlm`` (``family`` "smolvlm") or ``demo:vlm-idefics3``
    ("idefics3") into ``directory``, the marker last."""
    size, processor_class = (
        (SMOLVLM_SIZE, "SmolVLMProcessor") if family == "smolvlm" else (IDEFICS3_SIZE, "Idefics3Processor")
    )
    tokenizer, ids = write_demo_tokenizer(directory, [IMAGE_TOKEN, FAKE_TOKEN, GLOBAL_TOKEN, *ROW_COL_TOKENS])
    config = _config(tokenizer.get_vocab_size(), dtype, ids, family)
    weights = draw_weights(mlx_vlm_shapes(config), "language_model.", seed, files.damped_ids(tokenizer))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_chat_files(directory, ids, CHAT_TEMPLATE)
    files.write_json(directory / "preprocessor_config.json", _image_processor_config(family, processor_class))
    files.write_json(
        directory / "processor_config.json", {"processor_class": processor_class, "image_seq_len": TILE_TOKENS}
    )
    write_marker(directory, size, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(vocab_size: int, dtype: str, ids: dict[str, int], family: str) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        "model_type": "llama",
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
        "rope_theta": recipe.ROPE_THETA,
    }
    return {
        "model_type": family,
        "architectures": [
            "SmolVLMForConditionalGeneration" if family == "smolvlm" else "Idefics3ForConditionalGeneration"
        ],
        "text_config": text,
        "vision_config": {**VISION_SHAPE, "model_type": f"{family}_vision"},
        "scale_factor": 2,
        "image_token_id": ids[IMAGE_TOKEN],
        "vocab_size": vocab_size,
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "pad_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _image_processor_config(family: str, processor_class: str) -> dict[str, Any]:
    return {
        "image_processor_type": "SmolVLMImageProcessor" if family == "smolvlm" else "Idefics3ImageProcessor",
        "processor_class": processor_class,
        "size": {"longest_edge": LONGEST_EDGE},
        "max_image_size": {"longest_edge": TILE},
        "do_image_splitting": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "do_pad": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "resample": 1,
    }
