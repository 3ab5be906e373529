"""A VLM's prompt processor: templated text + loaded media -> token ids + vision inputs.

Built on the MLX thread when the model loads (from the processor ``mlx_vlm.load`` returns)
and handed to admission in :class:`ModelInfo`; its methods use numpy only, so admission runs
them in its preprocessing threads, never on the event loop or the MLX thread. mlx-vlm's own
``processor(...)`` call returns mx arrays, so this calls its numpy image / video processors
directly and expands the placeholders itself, as the processor does: each ``<|image_pad|>``
(``<|video_pad|>``) becomes one token per ``merge_size**2`` patches of that item's grid.
"""

from __future__ import annotations

import re
from typing import Any

import attrs
import numpy as np

from ...errors import InvalidRequestError
from ...messages import MediaInput

#: What a loaded item is, by the attribute it has (vllm_mlx_trio.media: LoadedImage.image, LoadedVideo.frames).
IMAGE, VIDEO = "image", "video"


@attrs.frozen(kw_only=True)
class VlmPromptProcessor:
    """The numpy half of a Qwen-VL processor, with the placeholder tokens it expands."""

    image_processor: Any = attrs.field(repr=False)
    video_processor: Any = attrs.field(repr=False)
    image_pad: str
    video_pad: str
    image_pad_id: int
    video_pad_id: int
    merge_size: int
    #: Tokens an item takes beyond its merged patches (LLaVA: its tower's class token, when kept).
    extra_tokens: int = 0

    @classmethod
    def of(cls, processor: Any) -> VlmPromptProcessor:
        """From the processor ``mlx_vlm.load`` returned (Qwen2-VL family)."""
        tokenizer = processor.tokenizer
        return cls(
            image_processor=processor.image_processor,
            video_processor=processor.video_processor or processor.image_processor,
            image_pad=processor.image_token,
            video_pad=processor.video_token,
            image_pad_id=tokenizer.convert_tokens_to_ids(processor.image_token),
            video_pad_id=tokenizer.convert_tokens_to_ids(processor.video_token),
            merge_size=processor.image_processor.merge_size,
        )

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        """(kind, patches, grid) of one loaded image or video."""
        if hasattr(item, "frames"):
            out = self.video_processor(videos=[list(item.frames)])
            return VIDEO, np.asarray(out["pixel_values_videos"]), tuple(int(x) for x in out["video_grid_thw"][0])
        out = self.image_processor(images=[item.image])
        return IMAGE, np.asarray(out["pixel_values"]), tuple(int(x) for x in out["image_grid_thw"][0])

    def expand(self, text: str, loaded: tuple[Any, ...]) -> tuple[str, list[tuple[str, np.ndarray, tuple]]]:
        """The templated text with each placeholder repeated for its item's tokens, and each
        item's (kind, patches, grid) in prompt order. The template must emit exactly one
        placeholder per media part, in order."""
        pads = [m.group(0) for m in re.finditer(f"{re.escape(self.image_pad)}|{re.escape(self.video_pad)}", text)]
        kinds = [IMAGE if pad == self.image_pad else VIDEO for pad in pads]
        items = [self.vision_inputs(item) for item in loaded]
        if kinds != [kind for kind, _, _ in items]:
            message = f"the chat template placed {len(pads)} media placeholders for {len(items)} media parts"
            raise InvalidRequestError(message, param="messages")
        pieces = re.split(f"({re.escape(self.image_pad)}|{re.escape(self.video_pad)})", text)
        out, index = [], 0
        for piece in pieces:
            if piece in (self.image_pad, self.video_pad):
                out.append(self.item_expansion(piece, items[index][2], loaded[index]))
                index += 1
            else:
                out.append(piece)
        return "".join(out), items

    def item_expansion(self, placeholder: str, grid: tuple[int, int, int], item: Any) -> str:
        """The text a template's placeholder becomes for the loaded ``item`` (by its grid alone here)."""
        return self.expansion(placeholder, grid)

    def expansion(self, placeholder: str, grid: tuple[int, int, int]) -> str:
        """The text a template's placeholder becomes for an item of grid ``grid``."""
        return placeholder * self.num_tokens(grid)

    def num_pads(self, grid: tuple[int, int, int]) -> int:
        """How many placeholder tokens (``image_pad_id``) an item's run holds: all of it here."""
        return self.num_tokens(grid)

    def num_tokens(self, grid_thw: tuple[int, int, int]) -> int:
        t, h, w = grid_thw
        return t * h * w // self.merge_size**2 + self.extra_tokens

    def media_inputs(
        self, token_ids: list[int], items: list[tuple[str, np.ndarray, tuple]], loaded: tuple[Any, ...]
    ) -> tuple[MediaInput, ...]:
        """Each item with its run of tokens in ``token_ids``: from its first placeholder token to
        its last (markers between them, such as row breaks, belong to the run)."""
        pad_ids = {self.image_pad_id, self.video_pad_id}
        pad_positions = [i for i, t in enumerate(token_ids) if t in pad_ids]
        media, cursor = [], 0
        for (kind, pixels, grid), item in zip(items, loaded, strict=True):
            num_pads = self.num_pads(grid)
            if cursor + num_pads > len(pad_positions):
                raise InvalidRequestError("the prompt's media placeholders did not tokenize", param="messages")
            start, last = pad_positions[cursor], pad_positions[cursor + num_pads - 1]
            media.append(
                MediaInput(
                    kind=kind,
                    start=start,
                    num_tokens=last - start + 1,
                    pixels=pixels,
                    grid_thw=grid,
                    cache_key=item.cache_key,
                )
            )
            cursor += num_pads
        return tuple(media)


@attrs.frozen(kw_only=True)
class Qwen3VlPromptProcessor(VlmPromptProcessor):
    """Qwen3-VL's and Qwen3.5's: images as Qwen2-VL's; a video's ``<|vision_start|><|video_pad|>
    <|vision_end|>`` becomes, per temporal patch group (``temporal_patch_size`` frames), its time
    ``<t.t seconds>`` and its own vision block of pads, as the model's processor writes it. The
    time is the mean of the group's first and last frame's time in the video (the last group
    repeats the last frame to fill it); the run spans the markers between the blocks."""

    vision_start: str
    vision_end: str
    temporal_patch_size: int

    @classmethod
    def of(cls, processor: Any) -> Qwen3VlPromptProcessor:
        base = VlmPromptProcessor.of(processor)
        video = processor.video_processor or processor.image_processor
        return cls(
            **attrs.asdict(base, recurse=False),
            vision_start=processor.vision_start_token,
            vision_end=processor.vision_end_token,
            temporal_patch_size=getattr(video, "temporal_patch_size", 2),
        )

    def expand(self, text: str, loaded: tuple[Any, ...]) -> tuple[str, list[tuple[str, np.ndarray, tuple]]]:
        """As Qwen2-VL's, each video's block written whole (a marker and a vision block per group)."""
        wrapped = f"{self.vision_start}{self.video_pad}{self.vision_end}"
        return super().expand(text.replace(wrapped, self.video_pad), loaded)

    def item_expansion(self, placeholder: str, grid: tuple[int, int, int], item: Any) -> str:
        if placeholder != self.video_pad:
            return super().item_expansion(placeholder, grid, item)
        t, h, w = grid
        pads = self.video_pad * (h * w // self.merge_size**2)
        block = f"{self.vision_start}{pads}{self.vision_end}"
        return "".join(f"<{seconds:.1f} seconds>{block}" for seconds in self._group_times(item, t))

    def _group_times(self, item: Any, groups: int) -> list[float]:
        times = list(getattr(item, "frame_times", ()) or (i / item.fps for i in range(len(item.frames))))
        size = self.temporal_patch_size
        times += times[-1:] * (groups * size - len(times))
        return [(times[first] + times[first + size - 1]) / 2 for first in range(0, groups * size, size)]


def images_only(processor: Any, pad: str, *, token_id_of: str | None = None) -> dict[str, Any]:
    """The shared fields of a model that takes images only: ``pad`` is the placeholder the
    template writes (video parts never reach it), its id that of ``token_id_of`` (default ``pad``),
    the token each vision feature replaces; no spatial merge in the placeholder count."""
    token_id = processor.tokenizer.convert_tokens_to_ids(token_id_of or pad)
    return {
        "image_processor": processor.image_processor,
        "video_processor": None,
        "image_pad": pad,
        "video_pad": pad,
        "image_pad_id": token_id,
        "video_pad_id": token_id,
        "merge_size": 1,
    }


@attrs.frozen(kw_only=True)
class LlavaPromptProcessor(VlmPromptProcessor):
    """LLaVA's: one ``<image>`` repeated once per vision patch of the (resized, cropped) image;
    images only."""

    patch_size: int

    @classmethod
    def of(cls, processor: Any) -> LlavaPromptProcessor:
        extra = processor.num_additional_image_tokens - (processor.vision_feature_select_strategy == "default")
        return cls(
            **images_only(processor, processor.image_token),
            extra_tokens=extra,
            patch_size=processor.patch_size,
        )

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        pixels = np.asarray(self.image_processor(images=[item.image], return_tensors="np")["pixel_values"])
        height, width = pixels.shape[-2:]
        return IMAGE, pixels, (1, height // self.patch_size, width // self.patch_size)


@attrs.frozen(kw_only=True)
class LlavaNextPromptProcessor(LlavaPromptProcessor):
    """LLaVA-NeXT's, as mlx-vlm 0.7.10 runs the model: the image is cut into crops ("anyres": the
    whole image resized, then the crops of its best grid resolution), and its features are each
    crop's patches followed by as many rows of the learned image newline, crop after crop; so its
    run is ``2 * crops * patches`` ``<image>`` tokens. An item's grid is ``(1, 2 * crops,
    patches)``; images only."""

    @classmethod
    def of(cls, processor: Any) -> LlavaNextPromptProcessor:
        return cls(**attrs.asdict(LlavaPromptProcessor.of(processor), recurse=False))

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        pixels = np.asarray(self.image_processor(images=[item.image], return_tensors="np")["pixel_values"])
        crops, (height, width) = pixels.shape[1], pixels.shape[-2:]
        return IMAGE, pixels, (1, 2 * crops, (height // self.patch_size) * (width // self.patch_size))


@attrs.frozen(kw_only=True)
class Gemma3PromptProcessor(VlmPromptProcessor):
    """Gemma 3's: the template's ``<start_of_image>`` becomes ``\n\n<start_of_image>``, one
    image token per pooled vision token, ``<end_of_image>\n\n``; images only, no pan-and-scan crops."""

    image_token: str
    end_of_image: str
    tokens_per_image: int

    @classmethod
    def of(cls, processor: Any) -> Gemma3PromptProcessor:
        return cls(
            **images_only(processor, processor.boi_token, token_id_of=processor.image_token),
            image_token=processor.image_token,
            end_of_image=processor.tokenizer.eoi_token,
            tokens_per_image=processor.image_seq_length,
        )

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        out = self.image_processor(images=[item.image], return_tensors="np", do_pan_and_scan=False)
        return IMAGE, np.asarray(out["pixel_values"]), (1, 1, self.tokens_per_image)

    def expansion(self, placeholder: str, grid: tuple[int, int, int]) -> str:
        return f"\n\n{placeholder}{self.image_token * self.num_tokens(grid)}{self.end_of_image}\n\n"


@attrs.frozen(kw_only=True)
class Gemma4PromptProcessor(VlmPromptProcessor):
    """Gemma 4's: the template's ``<|image|>`` becomes ``<|image>``, one ``<|image|>`` per soft
    token, ``<image|>``; the image processor resizes keeping the aspect ratio, so the count (the
    item's grid, ``(1, 1, soft tokens)``) depends on the image's size; images only."""

    begin: str
    end: str

    @classmethod
    def of(cls, processor: Any) -> Gemma4PromptProcessor:
        return cls(**images_only(processor, processor.image_token), begin=processor.boi_token, end=processor.eoi_token)

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        data, (soft_tokens,) = self.image_processor(images=[item.image])
        return IMAGE, np.asarray(data["pixel_values"]), (1, 1, int(soft_tokens))

    def expansion(self, placeholder: str, grid: tuple[int, int, int]) -> str:
        return f"{self.begin}{placeholder * self.num_tokens(grid)}{self.end}"


@attrs.frozen(kw_only=True)
class Mistral3PromptProcessor(VlmPromptProcessor):
    """Mistral 3's (Pixtral's): the template's ``[IMG]`` becomes one ``[IMG]`` per merged cell of
    the resized image, row by row, ``[IMG_BREAK]`` between rows, ``[IMG_END]`` last; the run
    counts all of them. An item's grid is ``(1, height, width)`` in pixels after resizing (the
    tower's ``image_sizes``); images only."""

    cell: int
    image_break: str
    image_end: str

    @classmethod
    def of(cls, processor: Any) -> Mistral3PromptProcessor:
        return cls(
            **images_only(processor, processor.image_token),
            cell=processor.patch_size * processor.spatial_merge_size,
            image_break=processor.image_break_token,
            image_end=processor.image_end_token,
        )

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        out = self.image_processor(images=[item.image], patch_size=self.cell)
        (height, width) = out["image_sizes"][0]
        return IMAGE, np.asarray(out["pixel_values"]), (1, int(height), int(width))

    def _cells(self, grid: tuple[int, int, int]) -> tuple[int, int]:
        return grid[1] // self.cell, grid[2] // self.cell

    def expansion(self, placeholder: str, grid: tuple[int, int, int]) -> str:
        rows, cols = self._cells(grid)
        return self.image_break.join([placeholder * cols] * rows) + self.image_end

    def num_pads(self, grid: tuple[int, int, int]) -> int:
        rows, cols = self._cells(grid)
        return rows * cols


@attrs.frozen(kw_only=True)
class SmolVlmPromptProcessor(VlmPromptProcessor):
    """SmolVLM's and Idefics3's: the template's ``<image>`` becomes, per tile of the split
    image, a row/column marker and its run of ``<image>`` tokens, then the global view's run,
    as the model's own processor writes it (its ``get_image_prompt_string``). An item's grid is
    ``(1, rows, cols)`` of tiles (0, 0: not split); its pixels hold every tile and the global view."""

    prompt_string: Any = attrs.field(repr=False)
    tile_tokens: int
    fake_token: str
    global_token: str

    @classmethod
    def of(cls, processor: Any) -> SmolVlmPromptProcessor:
        import sys

        return cls(
            **images_only(processor, processor.image_token),
            prompt_string=sys.modules[type(processor).__module__].get_image_prompt_string,
            tile_tokens=processor.image_seq_len,
            fake_token=processor.fake_image_token,
            # Idefics3's processor calls it a tag
            global_token=getattr(processor, "global_image_token", None) or processor.global_image_tag,
        )

    def vision_inputs(self, item: Any) -> tuple[str, np.ndarray, tuple[int, int, int]]:
        if hasattr(item, "frames"):
            raise InvalidRequestError("this model takes images, not video", param="messages")
        out = self.image_processor(images=[[item.image]], return_row_col_info=True, return_tensors="np")
        return IMAGE, np.asarray(out["pixel_values"]), (1, int(out["rows"][0][0]), int(out["cols"][0][0]))

    def expansion(self, placeholder: str, grid: tuple[int, int, int]) -> str:
        _, rows, cols = grid
        # positional: SmolVLM's and Idefics3's functions name the last argument differently
        return self.prompt_string(rows, cols, self.tile_tokens, self.fake_token, placeholder, self.global_token)

    def num_pads(self, grid: tuple[int, int, int]) -> int:
        _, rows, cols = grid
        return (rows * cols + 1) * self.tile_tokens if rows or cols else self.tile_tokens


#: The prompt processor of each architecture the vlm runner serves (Qwen-VL's by default).
PROMPT_PROCESSORS = {
    "llava": LlavaPromptProcessor,
    "llava_next": LlavaNextPromptProcessor,
    "gemma3": Gemma3PromptProcessor,
    "gemma4": Gemma4PromptProcessor,
    "mistral3": Mistral3PromptProcessor,
    "smolvlm": SmolVlmPromptProcessor,
    "idefics3": SmolVlmPromptProcessor,  # the same layout: SmolVLM's first release, Idefics3-8B
    "pixtral": Mistral3PromptProcessor,  # the same layout, without the patch merger
    "qwen3_vl": Qwen3VlPromptProcessor,
    "qwen3_vl_moe": Qwen3VlPromptProcessor,
    "qwen3_5": Qwen3VlPromptProcessor,
    "qwen3_5_moe": Qwen3VlPromptProcessor,
}


def prompt_processor(model_type: str, processor: Any) -> VlmPromptProcessor:
    """The numpy prompt processor of a ``model_type`` model, from its mlx-vlm processor."""
    return PROMPT_PROCESSORS.get(model_type, VlmPromptProcessor).of(processor)
