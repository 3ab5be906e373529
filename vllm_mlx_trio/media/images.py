"""Decode and check an image with Pillow: only common formats, verified before it is loaded,
refused when its header declares too many pixels (decompression bombs), EXIF orientation
applied, converted to RGB (as mlx-vlm's ``load_image`` does), scaled down to
``max_image_pixels`` with its aspect kept.

The declared media type (a data: URL's) must be an image type; which one is not checked
against the decoded format: clients often label every image ``image/jpeg``, and the bytes,
not the label, decide how they are decoded. Bytes that are no supported image are a 400.
"""

from __future__ import annotations

import hashlib
import io
import math
import struct

from PIL import Image, ImageOps, UnidentifiedImageError

from .loaded import refuse

#: The formats Pillow may decode (nothing exotic: each plugin is more attack surface).
IMAGE_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
#: What a corrupt file can make Pillow raise, all mapped to a 400.
DECODE_ERRORS = (
    UnidentifiedImageError,
    OSError,
    ValueError,
    SyntaxError,
    EOFError,
    struct.error,
    IndexError,
    Image.DecompressionBombError,
)


def decode_image(data: bytes, *, max_pixels: int, max_decoded_pixels: int, where: str) -> Image.Image:
    """The image in ``data`` as RGB, at most ``max_pixels`` pixels."""
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as probe:
            _check_declared_size(probe.size, max_decoded_pixels, where)
            probe.verify()
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
            image.seek(0)  # an animation: its first frame
            _draft(image, max_pixels)
            image.load()
            upright = ImageOps.exif_transpose(image)
            rgb = upright.convert("RGB")
    except DECODE_ERRORS as exc:
        formats = ", ".join(IMAGE_FORMATS)
        raise refuse(where, f"the data is not a valid image ({formats}): {type(exc).__name__}.") from None
    return fit_pixels(rgb, max_pixels)


def _draft(image: Image.Image, max_pixels: int) -> None:
    """Let a large JPEG decode at 1/2, 1/4 or 1/8 scale when that still leaves at least the
    size it is scaled to (libjpeg's DCT scaling: a 12 MP photo decodes several times faster).
    The EXIF rotation comes later and keeps the pixel count, so the bound holds either way."""
    width, height = fitted_size(image.width, image.height, max_pixels)
    if image.format == "JPEG" and image.width >= 2 * width and image.height >= 2 * height:
        image.draft(None, (width, height))  # mode None: no colour conversion by libjpeg (slower at scale 1)


def _check_declared_size(size: tuple[int, int], max_decoded_pixels: int, where: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise refuse(where, "the image has no pixels.")
    if width * height > max_decoded_pixels:
        raise refuse(
            where, f"the image is {width}x{height}, more than {max_decoded_pixels} pixels (mllm.max_decoded_pixels)."
        )


def fitted_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The largest size within ``max_pixels`` with the aspect of ``width`` x ``height``."""
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def fit_pixels(image: Image.Image, max_pixels: int) -> Image.Image:
    size = fitted_size(image.width, image.height, max_pixels)
    return image if size == image.size else image.resize(size, Image.Resampling.BICUBIC)


def image_cache_key(image: Image.Image, *, max_pixels: int) -> str:
    """sha256 over the decoded pixels (mode, size, bytes) and the option that shaped them."""
    digest = hashlib.sha256(b"image\0")
    digest.update(f"{image.mode}\0{image.width}x{image.height}\0max_pixels={max_pixels}\0".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()
