"""Quantized MTP heads: the checkpoint's quantization config, the head's layers quantized to match, and a check
that the stored tensors fit before they are loaded.

A quantized MLX checkpoint (``mlx_lm.convert``, mlx-vlm's ``convert`` / ``split_mtp``) stores each quantized layer
as a packed uint32 ``<layer>.weight`` beside ``<layer>.scales`` (and ``<layer>.biases`` in affine mode), norms and
layers whose input width is not a multiple of the group size in float. ``config.json`` records the quantization as
``quantization`` (mlx-lm writes the same dict as ``quantization_config``): ``group_size``, ``bits``, ``mode`` and
per-layer overrides keyed by the layer's path (a dict of parameters, or ``false`` for a layer kept in float).
mlx-vlm's splitter reads an MTP-only ``mtplx_mtp_quantization`` first; so does :func:`head_quantization`.

:func:`quantize_head` quantizes a head module as ``mlx_lm.load`` quantizes a model: ``nn.quantize`` with a class
predicate that takes a layer's override where the config names it, else quantizes exactly the layers whose
``.scales`` the checkpoint stores. Unlike mlx-lm, which infers a layer's bits and group size from the tensors'
shapes, the config decides, and :func:`check_fits` turns every disagreement into a ModelLoadError that names the
checkpoint key (a packed weight without its scales, scales for a layer the config keeps in float, a shape that
another bit width or group size would give). MLX thread only.
"""

from __future__ import annotations

from typing import Any

import attrs
import mlx.core as mx
import mlx.nn as nn

from ....errors import ModelLoadError

#: The keys of a quantization dict that are not per-layer overrides.
_PARAMS = ("group_size", "bits", "mode")
#: Config keys that may hold MLX's quantization, in the order they are read (the first that has ``bits``).
_CONFIG_KEYS = ("mtplx_mtp_quantization", "quantization", "quantization_config")
#: What a layer path may be prefixed with in an override's key, besides the checkpoint's own prefix: mlx-vlm nests
#: the text model under ``language_model``.
_OVERRIDE_ROOTS = ("", "language_model.")


@attrs.frozen
class HeadQuantization:
    """The quantization a checkpoint's ``config.json`` records."""

    #: ``group_size``, ``bits``, ``mode`` for layers no override names.
    default: dict[str, Any]
    #: Layer path (as the config spells it) -> parameters, or False for a layer kept in float.
    overrides: dict[str, dict[str, Any] | bool]
    #: The config key it came from (for error messages).
    source: str

    def for_layer(self, names: tuple[str, ...]) -> dict[str, Any] | bool | None:
        """The override of the first of ``names`` the config lists (full parameters), else None."""
        for name in names:
            if name in self.overrides:
                override = self.overrides[name]
                return {**self.default, **override} if isinstance(override, dict) else bool(override) and self.default
        return None


def head_quantization(config: dict[str, Any]) -> HeadQuantization | None:
    """The MLX quantization of ``config`` (top level or ``text_config``), or None for a float checkpoint (or one
    whose ``quantization_config`` is not MLX's, such as fp8 blocks that mlx-lm's sanitize dequantizes)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for source in (config, text):
        for key in _CONFIG_KEYS:
            value = source.get(key)
            if isinstance(value, dict) and "bits" in value and "group_size" in value:
                default = {"group_size": int(value["group_size"]), "bits": int(value["bits"])}
                default["mode"] = value.get("mode", "affine")
                overrides = {k: v for k, v in value.items() if k not in _PARAMS and isinstance(v, dict | bool)}
                return HeadQuantization(default=default, overrides=overrides, source=key)
    return None


def quantize_head(
    module: nn.Module, weights: dict[str, mx.array], quantization: HeadQuantization | None, *, prefix: str
) -> None:
    """Quantize ``module``'s layers as the checkpoint stores them, then :func:`check_fits`. ``weights``: the head's
    tensors named relative to ``module``; ``prefix``: what the checkpoint puts before those names (``mtp.``,
    ``model.layers.61.``), for override keys and error messages."""

    def predicate(path: str, layer: nn.Module) -> dict[str, Any] | bool:
        if not hasattr(layer, "to_quantized"):
            return False
        names = tuple(f"{root}{p}{path}" for root in _OVERRIDE_ROOTS for p in (prefix, ""))
        override = quantization.for_layer(names) if quantization is not None else None
        if override is not None:
            return dict(override) if override else False
        if f"{path}.scales" not in weights:
            return False
        if quantization is None:
            raise ModelLoadError(
                f"{prefix}{path}.scales: the checkpoint stores the MTP layer {prefix}{path} quantized, but config.json "
                "records no MLX quantization (a quantization dict with bits and group_size)"
            )
        return dict(quantization.default)

    try:
        nn.quantize(module, class_predicate=predicate)
    except ValueError as exc:  # an override the layer's shape cannot take (mx.quantize's message)
        raise ModelLoadError(f"{prefix}*: the config's quantization does not fit the MTP layers: {exc}") from exc
    check_fits(module, weights, quantization, prefix=prefix)


def check_fits(
    module: nn.Module, weights: dict[str, mx.array], quantization: HeadQuantization | None, *, prefix: str
) -> None:
    """A ModelLoadError naming the first checkpoint key whose presence, dtype or shape disagrees with how ``module``'s
    layers are (or are not) quantized; the parameters of layers that fit are left to the strict load."""
    for path, layer in module.named_modules():
        if not path or not hasattr(layer, "weight"):
            continue
        if _is_quantized(layer):
            _check_quantized_layer(path, layer, weights, prefix)
        else:
            _check_float_layer(path, weights, quantization, prefix)


def _is_quantized(layer: nn.Module) -> bool:
    return "scales" in layer and hasattr(layer, "bits") and hasattr(layer, "group_size")


def _check_quantized_layer(path: str, layer: nn.Module, weights: dict[str, mx.array], prefix: str) -> None:
    how = f"{layer.bits}-bit, group size {layer.group_size}, {getattr(layer, 'mode', 'affine')} mode"
    for name, expected in layer.parameters().items():
        if not isinstance(expected, mx.array):
            continue
        key = f"{path}.{name}"
        stored = weights.get(key)
        if stored is None:
            raise ModelLoadError(
                f"{prefix}{key} is missing: the config's quantization makes {prefix}{path} {how}, which needs it"
            )
        if tuple(stored.shape) != tuple(expected.shape):
            implied = _implied(path, weights, layer) if name == "weight" else ""
            raise ModelLoadError(
                f"{prefix}{key} has shape {tuple(stored.shape)}, but the config's quantization ({how}) gives "
                f"{tuple(expected.shape)}{implied}"
            )


def _check_float_layer(
    path: str, weights: dict[str, mx.array], quantization: HeadQuantization | None, prefix: str
) -> None:
    weight = weights.get(f"{path}.weight")
    if f"{path}.scales" in weights:
        source = quantization.source if quantization is not None else "quantization"
        raise ModelLoadError(
            f"{prefix}{path}.scales: the checkpoint stores {prefix}{path} quantized, but the config's {source} keeps "
            "it in float"
        )
    if weight is not None and weight.dtype == mx.uint32:
        raise ModelLoadError(
            f"{prefix}{path}.weight is packed (uint32) but {prefix}{path}.scales is missing: the quantized layer "
            "cannot be loaded without its scales"
        )


def _implied(path: str, weights: dict[str, mx.array], layer: nn.Module) -> str:
    """What the stored shapes say instead (bits and group size), for the error message."""
    scales, weight = weights.get(f"{path}.scales"), weights.get(f"{path}.weight")
    if scales is None or weight is None or scales.ndim == 0:
        return ""
    in_dims = layer.weight.shape[-1] * 32 // layer.bits
    return f" (the stored tensors fit {weight.shape[-1] * 32 // in_dims}-bit, group size {in_dims // scales.shape[-1]})"
