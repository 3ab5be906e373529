"""Media input for multimodal models: images and video from data: URLs, http(s) URLs and
allowed local files, fetched safely, decoded, validated and sampled (the input side; the
model side is ``worker/vlm``).

No mlx and no trio here: :class:`MediaLoader` is blocking and runs in admission's
preprocessing threads. Every bad input is an :class:`~vllm_mlx_trio.errors.InvalidRequestError`
naming the content part (``messages[1].content[2]``).
"""

from .loaded import LoadedImage, LoadedMedia, LoadedVideo
from .loader import MediaLoader

__all__ = ["LoadedImage", "LoadedMedia", "LoadedVideo", "MediaLoader"]
