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

import numpy as np

from . import recipe
from .vlm import TEXT_SHAPE
from .vlm_llava import IMAGE_SIZE, LlavaVariant, write_llava_family

LLAVA_NEXT_SIZE = "vlm-llava_next"
#: The resolutions an image may be cut into crops for: one, two side by side, two stacked.
IMAGE_GRID_PINPOINTS = [[IMAGE_SIZE, IMAGE_SIZE], [IMAGE_SIZE, 2 * IMAGE_SIZE], [2 * IMAGE_SIZE, IMAGE_SIZE]]


def write_llava_next(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
    """Write every file of ``demo:vlm-llava_next`` into ``directory``, the marker last."""
    variant = LlavaVariant(
        size=LLAVA_NEXT_SIZE,
        model_type="llava_next",
        class_stem="LlavaNext",
        image_processor_type="LlavaNextImageProcessor",
        extra_config={"image_grid_pinpoints": IMAGE_GRID_PINPOINTS},
        extra_image_processor={"image_grid_pinpoints": IMAGE_GRID_PINPOINTS, "do_pad": True},
        extra_weights=_image_newline,
    )
    write_llava_family(directory, variant, seed=seed, dtype=dtype)


def template_hash() -> str:
    from .vlm_llava import template_hash as llava_template_hash

    return llava_template_hash()


def _image_newline(seed: int) -> dict[str, np.ndarray]:
    """The learned newline embedding, drawn as the text embeddings are (draw_weights zeroes 1-D weights)."""
    newline = np.random.default_rng(seed + 1).standard_normal(TEXT_SHAPE["hidden_size"], dtype=np.float32)
    return {"image_newline": newline * np.float32(recipe.EMBED_STD)}
