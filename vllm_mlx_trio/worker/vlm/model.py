"""A Qwen-VL model as mlx-lm's BatchGenerator drives it, and one media prompt's prefill.

:class:`LanguageAdapter` is what the generator calls: token ids in, logits out, every row at
its own M-RoPE position (cache offset + the row's delta, ``worker/vlm/cache.py``); its caches
are :class:`RopeKVCache`. A prompt with media does not go through the generator's prefill:
:class:`MediaPrefill` encodes its images / videos with the vision tower, merges the features
into the token embeddings and prefills ``prompt[:-1]`` from those embeddings into a cache, one
unit of work per step (an item's encoding, or a chunk of prefill) so the running rows keep
decoding, placing each token at the M-RoPE position ``get_rope_index`` gives it. The runner
then inserts the last prompt token with that cache beside the text rows. With a prefix hit
only what is not cached is embedded, and only media whose tokens reach past the hit are
encoded; the rope delta is recomputed from the whole prompt (a pure function of the token ids
and the media grids), so a hit continues exactly as a cold prefill would.
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import RotatingKVCache

from ...messages import MediaInput, NewSequence
from .cache import RopeKVCache, row_positions, state_arrays
from .encode import SplitEncode


class LanguageAdapter:
    """The language half of a VLM with mlx-lm's model interface (``__call__`` -> logits,
    ``layers``, ``make_cache``), placing every row at its own M-RoPE position."""

    def __init__(self, model: Any):
        self.vlm = model
        self.language_model = model.language_model
        #: The decoder stack (``language_model.model``, or the language model itself: Idefics3).
        self.text_model = getattr(model.language_model, "model", model.language_model)
        #: The vision encoder (``vision_tower``; Idefics3 / SmolVLM: ``vision_model``).
        self.tower = getattr(model, "vision_tower", None) or getattr(model, "vision_model", None)
        #: Qwen-VL's 3-D M-RoPE (positions from ``get_rope_index``, a delta per row); else 1-D
        #: RoPE, where the language model places tokens by its cache offset alone.
        self.mrope = hasattr(model.language_model, "get_rope_index")
        #: Qwen3-VL adds its tower's deepstack features in its first text layers (Qwen3.5,
        #: with the same tower, does not).
        self.deepstack = "deepstack_visual_embeds" in inspect.signature(model.language_model.__call__).parameters
        #: Gemma 4's ``get_input_embeddings`` scales the token embeddings (its language model then
        #: takes them as given); the others' language models scale their own.
        self.embed_scale = getattr(self.text_model, "embed_scale", None) if _scales_embeddings(model) else None
        #: Gemma 4 E2B / E4B: per-layer inputs looked up from the token ids, a media token's as id 0.
        self.media_ids = _per_layer_media_ids(model, self.text_model)
        #: The first layer holding KV (a hybrid model's first layers are recurrent): its cache
        #: has the rows' offsets and rope deltas.
        self.kv_layer = next(i for i, c in enumerate(self.make_cache()) if isinstance(c, RopeKVCache | RotatingKVCache))

    @property
    def layers(self) -> list[Any]:
        return self.text_model.layers

    def embed(self, ids: mx.array) -> mx.array:
        """The token embeddings a prompt's prefill starts from (scaled where the model scales them
        before its language model)."""
        embeds = self.text_model.embed_tokens(ids)
        return embeds if self.embed_scale is None else embeds * self.embed_scale

    def prefill_ids(self, ids: mx.array) -> mx.array:
        """The token ids a media prefill chunk passes beside its embeddings: the per-layer inputs'
        lookup (Gemma 4) takes media tokens as id 0, as the model's ``get_input_embeddings`` does."""
        if not self.media_ids:
            return ids
        return mx.where(mx.array(np.isin(np.asarray(ids), self.media_ids)), mx.zeros_like(ids), ids)

    def make_cache(self) -> list[Any]:
        """mlx-lm caches (what the generator batches): the language model's own layout where it
        has one (Gemma 3's sliding-window layers rotate), else one :class:`RopeKVCache` a layer."""
        own = getattr(self.language_model, "make_cache", None)
        if own is None:
            return [RopeKVCache() for _ in self.layers]
        return [_mlx_lm_cache(cache) for cache in own()]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        assert cache is not None, "the adapter decodes from a cache"
        if not self.mrope:
            return self.language_model(inputs, cache=cache).logits
        positions = row_positions(cache[self.kv_layer], inputs.shape[1])
        return self.language_model(inputs, cache=cache, position_ids=positions).logits

    def parameters(self) -> Any:
        return self.vlm.parameters()


@attrs.define(eq=False)
class MediaPrefill:
    """One media prompt's way into a cache: encode, then prefill chunk by chunk.

    ``cache`` starts holding ``start`` cached tokens (a prefix hit) or none; when :attr:`done`
    it holds ``prompt[:-1]`` and its layers carry the prompt's rope delta."""

    seq: NewSequence
    cache: list[Any]
    start: int
    chunk: int
    #: Seconds of vision-tower blocks one step evaluates (at least one block); None: an
    #: item's whole encoding in one step (worker/vlm/encode.py).
    encode_budget_s: float | None = None
    #: (3, 1, L) M-RoPE positions of the whole prompt, and the delta after it.
    positions: mx.array | None = None
    rope_delta: int = 0
    embeds: mx.array | None = None  # (1, L - 1 - start, hidden): the tokens still to prefill
    cursor: int = 0
    encode_s: float = 0.0
    prefill_s: float = 0.0
    #: Media items the vision tower encoded (those wholly inside a prefix hit are not).
    num_encoded: int = 0
    #: Items still to encode, in order (those reaching past the cached prefix).
    to_encode: list[MediaInput] = attrs.field(factory=list)
    #: The item being encoded, over one or more steps, and its encoding.
    encoding: tuple[MediaInput, SplitEncode] | None = None
    #: This step encoded the last item (the runner reports ``encode_s`` then).
    encoding_finished: bool = False
    #: Qwen3-VL's deepstack: (layers, L - 1 - start, hidden) vision features added to the first
    #: text layers' outputs at the image tokens, and which of the uncached tokens those are.
    deepstack: mx.array | None = None
    visual: np.ndarray | None = None

    @property
    def end(self) -> int:
        return len(self.seq.prompt_token_ids) - 1

    @property
    def done(self) -> bool:
        encoded = not self.to_encode and self.encoding is None
        return self.embeds is not None and encoded and self.start + self.cursor >= self.end

    def step(self, adapter: LanguageAdapter) -> None:
        """One unit of work: a piece of a media item's vision encoding (its blocks for
        ``encode_budget_s``) while any is left, else one chunk of language prefill."""
        started = time.perf_counter()
        self.encoding_finished = False
        if self.embeds is None:
            self._start(adapter)
        if self.to_encode or self.encoding is not None:
            self._encode_step(adapter)
            self.encoding_finished = not self.to_encode and self.encoding is None
            self.encode_s += time.perf_counter() - started
        else:
            self._prefill_chunk(adapter)
            self.prefill_s += time.perf_counter() - started
        if self.done:  # the next tokens are placed after the prompt's M-RoPE grid
            for layer in self.cache:
                if isinstance(layer, RopeKVCache):
                    layer.rope_delta = self.rope_delta

    def _prefill_chunk(self, adapter: LanguageAdapter) -> None:
        a, b = self.start + self.cursor, min(self.end, self.start + self.cursor + self.chunk)
        if a < b:
            ids = mx.array(self.seq.prompt_token_ids[a:b])[None]
            window = slice(self.cursor, self.cursor + (b - a))
            embeds = self.embeds[:, window]
            place = {} if self.positions is None else {"position_ids": self.positions[..., a:b]}
            lm = adapter.language_model
            lm(adapter.prefill_ids(ids), inputs_embeds=embeds, cache=self.cache, **place, **self._deepstack(window))
            mx.eval([c.state for c in self.cache])
        self.cursor += b - a

    def _deepstack(self, window: slice) -> dict[str, Any]:
        """The deepstack arguments of the chunk ``window`` of the uncached tokens (none without
        visual tokens in it): its visual mask and those tokens' features, compact, per layer."""
        if self.deepstack is None or not self.visual[window].any():
            return {}
        rows = mx.array(np.flatnonzero(self.visual[window]) + window.start)
        return {
            "visual_pos_masks": mx.array(self.visual[window])[None],
            "deepstack_visual_embeds": [layer[rows] for layer in self.deepstack],
        }

    def _start(self, adapter: LanguageAdapter) -> None:
        """Positions for the whole prompt (its delta with them); token embeddings of the
        uncached part; which media items reach into it."""
        ids = mx.array(self.seq.prompt_token_ids)[None]
        media, model = self.seq.media, adapter.vlm
        if adapter.mrope:
            grids = {kind: _grids(media, kind) for kind in ("image", "video")}
            self.positions, deltas = model.language_model.get_rope_index(ids, grids["image"], grids["video"])
            self.rope_delta = int(np.asarray(deltas).reshape(-1)[0])
        self.embeds = adapter.embed(ids[:, self.start : self.end])
        self.to_encode = [
            item for item in media if max(item.start, self.start) < min(item.start + item.num_tokens, self.end)
        ]

    def _encode_step(self, adapter: LanguageAdapter) -> None:
        """Start the next item's encoding if none runs, then evaluate a piece of it; its
        features go into the embeddings once it is whole."""
        if self.encoding is None:
            item = self.to_encode.pop(0)
            encoding = SplitEncode(lambda: self._features(adapter, item), adapter.tower, self.encode_budget_s)
            self.encoding = (item, encoding)
        item, encoding = self.encoding
        if encoding.step():
            self.encoding = None
            self._write(item, *encoding.result)

    def _features(self, adapter: LanguageAdapter, item: MediaInput) -> tuple[mx.array, mx.array | None]:
        """(features, deepstack or None) of one item, as a lazy graph."""
        if adapter.mrope:
            features, deepstack = encode_media(adapter.vlm, item)
            return features, deepstack if adapter.deepstack else None
        placeholders = self.seq.prompt_token_ids[item.start : item.start + item.num_tokens]
        return embed_media(adapter.vlm, placeholders, item), None

    def _write(self, item: MediaInput, features: mx.array, deepstack: mx.array | None) -> None:
        """One item's features, written over its placeholder tokens' embeddings (the uncached ones)."""
        rows, at = self._feature_rows(item, features.shape[0])
        if _contiguous(rows) and _contiguous(at):  # one run of placeholders: slices
            rows, at = slice(int(rows[0]), int(rows[-1]) + 1), slice(int(at[0]), int(at[-1]) + 1)
        else:
            rows, at = mx.array(rows), mx.array(at)
        self.embeds[:, at] = features[rows][None]
        if deepstack is not None:
            self._add_deepstack(deepstack[:, rows], at)
        mx.eval(self.embeds, self.deepstack)
        self.num_encoded += 1

    def _feature_rows(self, item: MediaInput, num_features: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows of the item's features, positions among the uncached tokens they go to). The
        features cover the item's whole run, or (Qwen3-VL's video: time markers and block ends
        between its blocks) only its placeholder tokens, those equal to the run's first."""
        run = np.arange(item.start, item.start + item.num_tokens)
        if num_features != item.num_tokens:
            ids = np.asarray(self.seq.prompt_token_ids[item.start : item.start + item.num_tokens])
            run = run[ids == ids[0]]
        assert run.size == num_features, (run.size, num_features)
        uncached = (run >= self.start) & (run < self.end)
        return np.flatnonzero(uncached), run[uncached] - self.start

    def _add_deepstack(self, features: mx.array, at: slice | mx.array) -> None:
        if self.deepstack is None:
            length = self.embeds.shape[1]
            self.deepstack = mx.zeros((features.shape[0], length, features.shape[-1]), features.dtype)
            self.visual = np.zeros(length, dtype=bool)
        self.deepstack[:, at] = features
        self.visual[at if isinstance(at, slice) else np.asarray(at)] = True


#: Architectures whose ``get_input_embeddings`` scales the token embeddings itself.
SCALED_EMBEDDINGS = frozenset({"gemma4"})


def _scales_embeddings(model: Any) -> bool:
    return getattr(model.config, "model_type", None) in SCALED_EMBEDDINGS


def _per_layer_media_ids(model: Any, text_model: Any) -> list[int]:
    """The media token ids a model with per-layer inputs (Gemma 4 E2B / E4B) looks up as id 0."""
    if not getattr(text_model, "hidden_size_per_layer_input", 0):
        return []
    names = ("image_token_id", "audio_token_id", "video_token_id")
    return [int(i) for i in (getattr(model.config, name, None) for name in names) if i is not None]


def _contiguous(indices: np.ndarray) -> bool:
    return bool(indices.size) and int(indices[-1] - indices[0]) == indices.size - 1


def encode_media(model: Any, item: MediaInput) -> tuple[mx.array, mx.array | None]:
    """The vision tower's features of one image or video, (placeholders, hidden), and its
    deepstack features (layers, placeholders, hidden) for a tower that gives them (Qwen3-VL)."""
    tower = model.vision_tower
    pixels = mx.array(item.pixels).astype(tower.patch_embed.proj.weight.dtype)
    out = tower(pixels, mx.array([item.grid_thw]), output_hidden_states=False)
    features, deepstack = out if isinstance(out, tuple) else (out, None)
    return features, (mx.stack(deepstack) if deepstack else None)


#: What an architecture's ``get_input_embeddings`` needs beside the pixels, from the item
#: (worker/vlm/processor.py says what its grid holds): Mistral 3's tower takes the image's size.
EMBED_KWARGS = {
    "mistral3": lambda item: {"image_sizes": [item.grid_thw[1:]]},
    "pixtral": lambda item: {"image_sizes": [item.grid_thw[1:]]},
}


def _mlx_lm_cache(cache: Any) -> Any:
    """mlx-lm's cache of the kind of mlx-vlm's ``cache``: a rotating window, a recurrent
    layer's state arrays (Qwen3.5's Gated DeltaNet), or plain KV."""
    if hasattr(cache, "max_size"):
        return RotatingKVCache(max_size=cache.max_size, keep=cache.keep)
    if not hasattr(cache, "offset") and hasattr(cache, "cache"):
        # mlx-vlm's own recurrent-state cache (its Gated DeltaNet calls its API); it batches
        # as mlx-lm's does, and the prefix store and a speculative rollback snapshot its arrays
        return state_arrays(cache)
    return RopeKVCache()


def embed_media(model: Any, placeholders: tuple[int, ...], item: MediaInput) -> mx.array:
    """One image's features through the model's own ``get_input_embeddings`` (the vision tower,
    feature selection and projector, as mlx-vlm runs them): the embeddings of its run of
    placeholder tokens, (num_tokens, hidden)."""
    ids = mx.array(placeholders)[None]
    extra = EMBED_KWARGS.get(model.config.model_type, lambda item: {})(item)
    pixels = mx.array(item.pixels)
    features = model.get_input_embeddings(ids, pixel_values=pixels, mask=mx.ones_like(ids), **extra).inputs_embeds[0]
    assert features.shape[0] == item.num_tokens, (features.shape, item.num_tokens)
    return features


def _grids(media: tuple[MediaInput, ...], kind: str) -> mx.array | None:
    grids = [item.grid_thw for item in media if item.kind == kind]
    return mx.array(grids) if grids else None


def new_prefill(
    seq: NewSequence,
    cache: list[Any] | None,
    adapter: LanguageAdapter,
    chunk: int,
    encode_budget_s: float | None = None,
) -> MediaPrefill:
    """The prefill of a media prompt, from its prefix hit's cache (or an empty one)."""
    cache = cache or adapter.make_cache()
    return MediaPrefill(seq=seq, cache=cache, start=seq.num_cached_tokens, chunk=chunk, encode_budget_s=encode_budget_s)
