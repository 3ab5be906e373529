"""The demo vision-language model: a tiny Qwen2-VL (M-RoPE) with random weights.

``build_demo_vlm`` writes a directory in Hugging Face layout that ``mlx_vlm.load`` reads
exactly like a downloaded checkpoint: ``config.json`` (text + vision config), random
``model.safetensors`` in the checkpoint's own names (``model.*``, ``visual.*``), the demo
tokenizer (same BPE as ``demo:tiny``) extended by the vision specials, a ChatML template that
emits ``<|vision_start|><|image_pad|><|vision_end|>`` (``<|video_pad|>``) for media parts, and
local ``preprocessor_config.json`` / ``video_preprocessor_config.json`` (mlx-vlm's numpy
processors; no hub, no torch). The same seed always gives the same files.

Shares the text demo's corpus, tokenizer, safetensors writer and install step
(worker/demo/files.py, worker/demo/recipe.py); this module only adds what a VLM needs. Imports no
MLX at module level.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Sequence
from functools import partial
from typing import Any

import attrs
import numpy as np

from . import files, recipe

#: The size name ``demo:vlm-tiny`` / ``demo build --size vlm-tiny`` selects.
VLM_SIZE = "vlm-tiny"
#: Bump when anything below changes, so older cached builds are rebuilt.
VLM_FORMAT_VERSION = 2

VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)

#: Tiny shapes: a 2-layer text model (head_dim 16, M-RoPE sections 2+3+3 = head_dim/2) and a
#: 1-block vision tower with 14-pixel patches merged 2x2 (one token per 28x28 pixels).
TEXT_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 4096,
}
MROPE_SECTION = [2, 3, 3]
VISION_SHAPE = {
    "depth": 1,
    "embed_dim": 32,
    "num_heads": 2,
    "mlp_ratio": 2,
    "patch_size": 14,
    "spatial_patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
}
#: Image sizes the processor resizes into: at least 56x56 (4 tokens), at most 448x448 (256 tokens).
MIN_PIXELS = 56 * 56
MAX_PIXELS = 448 * 448
#: Video frames are kept small: at most 112x112 per frame pair (16 tokens).
VIDEO_MAX_PIXELS = 112 * 112
IMAGE_MEAN = [0.48145466, 0.4578275, 0.40821073]
IMAGE_STD = [0.26862954, 0.26130258, 0.27577711]


@attrs.frozen
class QwenVlDemo:
    """One Qwen-VL family architecture as a demo: what its config.json and processor files name."""

    #: The demo name (``demo:<size>``).
    size: str
    model_type: str
    architecture: str
    processor_class: str
    #: The vision tower's config beyond :data:`VISION_SHAPE` (each architecture's own fields).
    vision_extra: dict[str, Any] = attrs.field(factory=dict)
    #: Text fields beyond :data:`TEXT_SHAPE`.
    text_extra: dict[str, Any] = attrs.field(factory=dict)
    #: The text config nests under ``text_config`` (Qwen3-VL) instead of the top level (Qwen2/2.5-VL).
    nested_text: bool = False
    #: The stored dtype when none is asked for (None: the demos' default).
    dtype: str | None = None
    #: Where the checkpoint keeps the language model and the vision tower (mlx-vlm's sanitize maps them back).
    text_prefix: str = "model."
    vision_prefix: str = "visual."


#: Qwen3-VL's tower: 16-pixel patches merged 2x2 (one token per 32x32 pixels), a 4x4 learned
#: position grid, deepstack features from the first block added after the first text layer.
_QWEN3_VL_TOWER = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "out_hidden_size": TEXT_SHAPE["hidden_size"],
    "patch_size": 16,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0],
    "depth": 2,
}
#: Qwen3.5's tower: Qwen3-VL's, its deepstack features unused.
_QWEN3_5_TOWER = {**_QWEN3_VL_TOWER, "deepstack_visual_indexes": []}
#: Qwen3.5's hybrid text model: three Gated DeltaNet layers, then one attention layer with
#: partial M-RoPE.
_QWEN3_5_TEXT = {
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": recipe.ROPE_THETA,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
    },
}


#: The Qwen-VL family demos by name: Qwen2-VL (``demo:vlm-tiny``), Qwen2.5-VL (windowed vision
#: tower with full-attention blocks), Qwen3-VL (learned position embeddings, deepstack features
#: added in the first text layers, nested text config).
QWEN_VL_DEMOS = {
    demo.size: demo
    for demo in (
        QwenVlDemo(VLM_SIZE, "qwen2_vl", "Qwen2VLForConditionalGeneration", "Qwen2VLProcessor"),
        # demo:vlm-tiny with an 8-block vision tower: for measuring an encoding spread over steps
        QwenVlDemo(
            "vlm-deep-tower",
            "qwen2_vl",
            "Qwen2VLForConditionalGeneration",
            "Qwen2VLProcessor",
            vision_extra={"depth": 8, "embed_dim": 64, "num_heads": 4},
        ),
        QwenVlDemo(
            "vlm-qwen2_5_vl",
            "qwen2_5_vl",
            "Qwen2_5_VLForConditionalGeneration",
            "Qwen2_5_VLProcessor",
            # window 56 px = 2x2 merged tokens: an 84x112 image spans several windows
            vision_extra={
                "hidden_size": 32,
                "intermediate_size": 64,
                "out_hidden_size": TEXT_SHAPE["hidden_size"],
                "window_size": 56,
                "fullatt_block_indexes": [1],
                "depth": 2,
            },
        ),
        QwenVlDemo(
            "vlm-qwen3_vl",
            "qwen3_vl",
            "Qwen3VLForConditionalGeneration",
            "Qwen3VLProcessor",
            vision_extra=_QWEN3_VL_TOWER,
            text_extra={"head_dim": 16},
            nested_text=True,
            text_prefix="model.language_model.",
            vision_prefix="model.visual.",
        ),
        QwenVlDemo(
            "vlm-qwen3_vl_moe",
            "qwen3_vl_moe",
            "Qwen3VLMoeForConditionalGeneration",
            "Qwen3VLProcessor",
            # as vlm-qwen3_vl, its MLPs a mixture of 4 experts (2 a token); float32: no bfloat16 GatherMM on the CPU
            dtype="float32",
            vision_extra=_QWEN3_VL_TOWER,
            text_extra={
                "head_dim": 16,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "moe_intermediate_size": 32,
            },
            nested_text=True,
            text_prefix="model.language_model.",
            vision_prefix="model.visual.",
        ),
        QwenVlDemo(
            "vlm-qwen3_5",
            "qwen3_5",
            "Qwen3_5ForConditionalGeneration",
            "Qwen3VLProcessor",
            vision_extra=_QWEN3_5_TOWER,
            text_extra=_QWEN3_5_TEXT,
            nested_text=True,
            text_prefix="model.language_model.",
            vision_prefix="model.visual.",
        ),
        QwenVlDemo(
            "vlm-qwen3_5_moe",
            "qwen3_5_moe",
            "Qwen3_5MoeForConditionalGeneration",
            "Qwen3VLProcessor",
            dtype="float32",
            # as vlm-qwen3_5, its MLPs a mixture of 4 experts (2 a token) and a shared expert; float32:
            # MLX on the CPU has no bfloat16 GatherMM
            vision_extra=_QWEN3_5_TOWER,
            text_extra={
                **_QWEN3_5_TEXT,
                "num_experts": 4,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 64,
            },
            nested_text=True,
            text_prefix="model.language_model.",
            vision_prefix="model.visual.",
        ),
    )
}

#: The text demo's ChatML template, with media parts rendered as Qwen2-VL placeholders.
CHAT_TEMPLATE = recipe.CHAT_TEMPLATE.replace(
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}",
    "{%- if part['type'] == 'text' %}{{- part['text'] }}"
    "{%- elif part['type'] == 'image' %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- endif %}",
)


def image_chat_template(image_text: str) -> str:
    """The text demo's ChatML template with an image part rendered as ``image_text`` (a
    model's own placeholder, which its processor expands)."""
    return recipe.CHAT_TEMPLATE.replace(
        "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}",
        "{%- if part['type'] == 'text' %}{{- part['text'] }}"
        f"{{%- elif part['type'] == 'image' %}}{{{{- '{image_text}' }}}}"
        "{%- endif %}",
    )


def template_hash(chat_template: str = CHAT_TEMPLATE) -> str:
    """What a build records so that a build with another template or format is rebuilt."""
    return hashlib.sha256(f"{VLM_FORMAT_VERSION}:{chat_template}".encode()).hexdigest()


def write_demo_tokenizer(
    directory: pathlib.Path, added_tokens: Sequence[str], vocab_size: int = recipe.DEMO_SIZES["tiny"].vocab_size
) -> tuple[Any, dict[str, int]]:
    """Train the demo tokenizer, add a VLM's ``added_tokens``, write ``tokenizer.json``; the
    tokenizer and the ids of ChatML's special tokens and the added ones."""
    tokenizer = files.train_tokenizer(vocab_size)
    tokenizer.add_special_tokens(list(added_tokens))
    ids = {token: tokenizer.token_to_id(token) for token in (*files.SPECIAL_TOKENS, *added_tokens)}
    (directory / "tokenizer.json").write_text(tokenizer.to_str(pretty=True) + "\n", encoding="utf-8")
    return tokenizer, ids


def write_chat_files(directory: pathlib.Path, ids: dict[str, int], chat_template: str, **tokenizer_extra: Any) -> None:
    """A VLM demo's generation, tokenizer and special-token configs: ChatML's end tokens, its
    ``chat_template`` (``tokenizer_extra``: more tokenizer_config.json fields)."""
    end = ids[files.IM_END], ids[files.ENDOFTEXT]
    generation = {"bos_token_id": end[1], "pad_token_id": end[1], "eos_token_id": list(end)}
    files.write_json(directory / "generation_config.json", generation)
    tokenizer_config = recipe.tokenizer_config(TEXT_SHAPE["max_position_embeddings"], chat_template)
    files.write_json(directory / "tokenizer_config.json", {**tokenizer_config, **tokenizer_extra})
    special = {"eos_token": files.IM_END, "pad_token": files.ENDOFTEXT}
    files.write_json(directory / "special_tokens_map.json", special)


def write_marker(directory: pathlib.Path, size: str, *, seed: int, dtype: str, chat_template: str) -> None:
    """The demo's marker, written last: a build is complete once it is there."""
    marker = {"format_version": VLM_FORMAT_VERSION, "size": size, "seed": seed, "dtype": dtype}
    files.write_json(directory / recipe.DEMO_MARKER, {**marker, "chat_template_sha256": template_hash(chat_template)})


def writer(size: str) -> Any:
    """``write(directory, *, seed, dtype)`` of the Qwen-VL family demo ``size``."""
    return partial(write_vlm, demo=QWEN_VL_DEMOS[size])


def build_demo_vlm(
    out_dir: str | pathlib.Path,
    *,
    seed: int = 0,
    dtype: str = recipe.DEFAULT_DTYPE,
    replace: bool = True,
    size: str = VLM_SIZE,
) -> pathlib.Path:
    """Build the tiny VLM ``size`` into ``out_dir`` (through a temporary sibling, as every demo is built)."""
    return recipe.build_into(out_dir, writer(size), seed=seed, dtype=dtype, replace=replace)


def write_vlm(directory: pathlib.Path, *, seed: int, dtype: str, demo: QwenVlDemo = QWEN_VL_DEMOS[VLM_SIZE]) -> None:
    """Write every file of the demo ``demo`` (``demo:vlm-tiny`` by default) into ``directory``, the marker last."""
    tokenizer, ids = write_demo_tokenizer(directory, VISION_TOKENS)
    config = _config(demo, tokenizer.get_vocab_size(), dtype, ids)
    weights = _random_weights(demo, config, seed, files.damped_ids(tokenizer))
    files.write_safetensors(directory / "model.safetensors", weights, dtype)
    files.write_json(directory / "config.json", config)
    write_chat_files(directory, ids, CHAT_TEMPLATE)
    files.write_json(directory / "preprocessor_config.json", _image_processor_config(demo))
    files.write_json(directory / "video_preprocessor_config.json", _video_processor_config(demo))
    # Present so mlx-vlm's processor loader never asks the hub for it.
    files.write_json(directory / "processor_config.json", {"processor_class": demo.processor_class})
    write_marker(directory, demo.size, seed=seed, dtype=dtype, chat_template=CHAT_TEMPLATE)


def _config(demo: QwenVlDemo, vocab_size: int, dtype: str, ids: dict[str, int]) -> dict[str, Any]:
    """``config.json`` of the architecture's checkpoint (text fields at the top level, as
    Qwen2/2.5-VL have them, or under ``text_config`` as Qwen3-VL has them)."""
    text = {
        **TEXT_SHAPE,
        **demo.text_extra,
        "model_type": demo.model_type,
        "vocab_size": vocab_size,
        "rms_norm_eps": recipe.RMS_NORM_EPS,
        "rope_theta": recipe.ROPE_THETA,
        "rope_scaling": {"type": "mrope", "mrope_section": MROPE_SECTION},
        "tie_word_embeddings": True,
        "hidden_act": "silu",
    }
    vision = {**VISION_SHAPE, "hidden_size": TEXT_SHAPE["hidden_size"], **demo.vision_extra}
    return {
        **({"text_config": text} if demo.nested_text else text),
        "model_type": demo.model_type,
        "architectures": [demo.architecture],
        "vocab_size": vocab_size,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        "use_cache": True,
        "vision_config": {**vision, "model_type": demo.model_type},
        "image_token_id": ids[IMAGE_PAD],
        "video_token_id": ids[VIDEO_PAD],
        "vision_start_token_id": ids[VISION_START],
        "vision_end_token_id": ids[VISION_END],
        "bos_token_id": ids[files.ENDOFTEXT],
        "pad_token_id": ids[files.ENDOFTEXT],
        "eos_token_id": ids[files.IM_END],
    }


def _processor_common(demo: QwenVlDemo) -> dict[str, Any]:
    return {
        "patch_size": {**VISION_SHAPE, **demo.vision_extra}["patch_size"],
        "temporal_patch_size": VISION_SHAPE["temporal_patch_size"],
        "merge_size": VISION_SHAPE["spatial_merge_size"],
        "image_mean": IMAGE_MEAN,
        "image_std": IMAGE_STD,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "do_convert_rgb": True,
        "processor_class": demo.processor_class,
    }


def _image_processor_config(demo: QwenVlDemo) -> dict[str, Any]:
    common = _processor_common(demo)
    return {
        **common,
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": MAX_PIXELS,
    }


def _video_processor_config(demo: QwenVlDemo) -> dict[str, Any]:
    common = _processor_common(demo)
    return {
        **common,
        "video_processor_type": "Qwen2VLVideoProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": VIDEO_MAX_PIXELS,
        "fps": 2.0,
        "min_frames": 2,
        "max_frames": 16,
    }


def _parameter_shapes(demo: QwenVlDemo, config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Checkpoint names (as Hugging Face stores the architecture: ``model.*`` and ``visual.*`` for
    Qwen2-VL) and shapes."""
    shapes = mlx_vlm_shapes(config)
    return {
        name.replace("language_model.model.", demo.text_prefix).replace("vision_tower.", demo.vision_prefix): shape
        for name, shape in shapes.items()
    }


def mlx_vlm_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """mlx-vlm's own parameter names and shapes of the model ``config`` describes."""
    import importlib

    from mlx.utils import tree_flatten

    arch = importlib.import_module(f"mlx_vlm.models.{config['model_type']}")
    model_config = arch.ModelConfig.from_dict(dict(config))
    model_config.vision_config = arch.VisionConfig.from_dict(config["vision_config"])
    text = model_config.text_config
    model_config.text_config = text if isinstance(text, arch.TextConfig) else arch.TextConfig.from_dict(text)
    model = arch.Model(model_config)
    return {name: tuple(p.shape) for name, p in tree_flatten(model.parameters())}


def _random_weights(
    demo: QwenVlDemo, config: dict[str, Any], seed: int, damped_ids: list[int]
) -> dict[str, np.ndarray]:
    return draw_weights(_parameter_shapes(demo, config), demo.text_prefix, seed, damped_ids)


def draw_weights(
    shapes: dict[str, tuple[int, ...]], text_prefix: str, seed: int, damped_ids: list[int]
) -> dict[str, np.ndarray]:
    """As the text demo draws them (sorted names, one rng): normal matrices, constant norms,
    the final norm (``<text_prefix>norm.weight``) scaling logits to ``LOGIT_STD``, damped
    special/byte rows of ``<text_prefix>embed_tokens.weight``."""
    rng = np.random.default_rng(seed)
    hidden = TEXT_SHAPE["hidden_size"]
    weights: dict[str, np.ndarray] = {}
    embed = text_prefix + "embed_tokens.weight"
    for name, shape in sorted(shapes.items()):
        if name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_q.weight")):
            final = name == text_prefix + "norm.weight"
            scale = recipe.LOGIT_STD / (recipe.EMBED_STD * hidden**0.5) if final else 1.0
            weights[name] = np.full(shape, scale, dtype=np.float32)
        elif len(shape) == 1:  # biases
            weights[name] = np.zeros(shape, dtype=np.float32)
        else:
            std = recipe.EMBED_STD if name == embed else int(np.prod(shape[1:])) ** -0.5
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
    weights[embed][damped_ids] *= np.float32(recipe.SPECIAL_ROW_SCALE)
    return weights
