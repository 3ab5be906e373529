"""``demo:vlm-llava_next``: a tiny LLaVA-NeXT (CLIP vision tower, projector, learned image newline,
Llama text model, 1-D RoPE) with random weights, in the layout ``mlx_vlm.load`` reads as a
llava-hf LLaVA-NeXT checkpoint.

LLaVA-NeXT's image processor ("anyres") resizes an image to the best of
:data:`IMAGE_GRID_PINPOINTS`, cuts it into :data:`IMAGE_SIZE` crops and puts the whole image,
resized, first (transformers' PIL backend: no torch). A user turn's image part is one
``<image>`` in the template. Shares the LLaVA demo's tower, tokenizer and template
(worker/demo/vlm_llava.py) and the demo recipe. Imports no MLX at module level.
"""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from . import files, recipe
from .vlm import IMAGE_MEAN, IMAGE_STD, TEXT_SHAPE, draw_weights, mlx_vlm_shapes, write_chat_files, write_marker
from .vlm_llava import CHAT_TEMPLATE, IMAGE_SIZE, IMAGE_TOKEN, VISION_SHAPE

LLAVA_NEXT_SIZE = "vlm-llava_next"
#: The resolutions an image may be cut into crops for: one, two side by side, two stacked.
IMAGE_GRID_PINPOINTS = [[IMAGE_SIZE, IMAGE_SIZE], [IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE]]


def write_llava_next(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-llava_next`` into ``directory``, the marker last."""
    tokenizer = files.train_tokenizer(recipe.DEMO_SIZES["tiny"].vocab_size)
    tokenizer.add_special_tokens([IMAGE_TOKEN])
    ids = {token: tokenizer.token_to_id(token) for token in (*files.SPECIAL_TOKENS, IMAGE_TOKEN)}
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    config = _config(tokenizer.get_vocab_size(), dtype, ids)
    weights = draw_weights(mlx_vlm_shapes(config), "language_model.model.", seed, files.damped_ids(tokenizer))
    # the learned newline embedding, as the text embeddings are drawn (draw_weights zeroes 1-D weights)
    newline = np.random.default_rng(seed + 1).standard_normal(TEXT_SHAPE["hidden_size"], dtype=np.float32)
    weights["image_newline"] = newline * np.float32(recipe.EMBED_STD)
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_chat_files(directory, ids, CHAT_TEMPLATE)
    files.write_json(directory / "preprocessor_config.json", _image_processor_config())
    processor = {
        "processor_class": "LlavaNextProcessor",
        "patch_size": VISION_SHAPE["patch_size"],
        "vision_feature_select_strategy": "default",
        "num_additional_image_tokens": 1,
        "image_token": IMAGE_TOKEN,
    }
    files.write_json(directory / "processor_config.json", processor)
    write_marker(directory, LLAVA_NEXT_SIZE, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def template_hash() -> str:
    from .vlm_llava import template_hash as llava_template_hash

    return llava_template_hash()


def _config(vocab_size: int, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    text = {
        **TEXT_SHAPE,
        "model_type": "llama",
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
        "rope_theta": recipe.ROPE_THETA,
        "tie_word_embeddings": True,
    }
    return {
        "model_type": "llava_next",
        "architectures": ["LlavaNextForConditionalGeneration"],
        "text_config": text,
        "vision_config": VISION_SHAPE,
        "image_token_index": ids[IMAGE_TOKEN],
        "image_grid_pinpoints": IMAGE_GRID_PINPOINTS,
        "vision_feature_select_strategy": "default",
        "vision_feature_layer": -2,
        "projector_hidden_act": "gelu",
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "bos_token_id": ids[files.ENDOFTEXT],
        "pad_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _image_processor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "LlavaNextImageProcessor",
        "processor_class": "LlavaNextProcessor",
        "size": {"shortest_edge": IMAGE_SIZE},
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "image_grid_pinpoints": IMAGE_GRID_PINPOINTS,
        "do_resize": True,
        "do_center_crop": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_pad": True,
        "do_convert_rgb": True,
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "resample": 3,
    }
