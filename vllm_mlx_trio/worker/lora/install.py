"""Loading named adapters (mlx-lm's adapter format) onto one base model as multi-adapter layers.

An adapter folder holds ``adapter_config.json`` (``fine_tune_type`` "lora", ``lora_parameters``
with ``scale``) and ``adapters.safetensors`` (``<layer path>.lora_a`` / ``.lora_b`` per adapted
linear layer), what ``mlx_lm.lora`` writes and ``mlx_lm.load(path, adapter_path=...)`` reads.
Every layer some adapter adapts becomes one :class:`MultiLoRALinear`; an adapter that leaves a
layer alone has zeros there, as the base has.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from ...errors import ModelLoadError
from .multi_linear import AdapterRows, MultiLoRALinear

_SUFFIXES = (".lora_a", ".lora_b")


@attrs.frozen
class AdapterWeights:
    """One adapter as read: its scale and, per adapted layer path, (lora_a, lora_b)."""

    scale: float
    layers: Mapping[str, tuple[mx.array, mx.array]]


def read_adapter(name: str, folder: str) -> AdapterWeights:
    """The adapter in ``folder``; ModelLoadError for one this server cannot apply per row."""
    where = pathlib.Path(folder)
    try:
        config = json.loads((where / "adapter_config.json").read_text(encoding="utf-8"))
        weights = mx.load(str(where / "adapters.safetensors"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"model.adapters.{name} ({folder!r}): {type(exc).__name__}: {exc}") from exc
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora" or config.get("use_dora"):
        raise ModelLoadError(f"model.adapters.{name}: only LoRA adapters are served per row (this one is {kind!r})")
    scale = float(config.get("lora_parameters", {}).get("scale", 20.0))
    layers = {}
    for key in weights:
        if not key.endswith(_SUFFIXES):
            raise ModelLoadError(f"model.adapters.{name}: unexpected weight {key!r} (LoRA weights only)")
        path = key[: -len(".lora_a")]
        layers[path] = (weights[f"{path}.lora_a"], weights[f"{path}.lora_b"])
    return AdapterWeights(scale, layers)


def install_adapters(model: nn.Module, adapters: Mapping[str, AdapterWeights]) -> tuple[AdapterRows, dict[str, int]]:
    """Replace each adapted linear layer of ``model`` with a :class:`MultiLoRALinear`; (the rows
    object the runner sets before each forward, each adapter's slot: 1, 2, ... in order)."""
    slots = {name: i + 1 for i, name in enumerate(adapters)}
    rank = max(a.shape[1] for adapter in adapters.values() for a, _ in adapter.layers.values())
    rows = AdapterRows(rank)
    modules = dict(model.named_modules())
    paths = sorted({path for adapter in adapters.values() for path in adapter.layers})
    replaced = []
    for path in paths:
        linear = modules.get(path)
        if not isinstance(linear, (nn.Linear, nn.QuantizedLinear)):
            raise ModelLoadError(f"model.adapters: the adapters adapt {path!r}, not a linear layer of this model")
        lora_a, lora_b = _side_by_side(path, adapters, rank)
        scale = mx.array([0.0, *(a.scale for a in adapters.values())], dtype=mx.float32)
        replaced.append((path, MultiLoRALinear(linear, lora_a, lora_b, scale, rows)))
    model.update_modules(tree_unflatten(replaced))
    mx.eval(model.parameters())
    return rows, slots


def _side_by_side(path: str, adapters: Mapping[str, AdapterWeights], rank: int) -> tuple[mx.array, mx.array]:
    """(in, slots * rank) and (slots * rank, out) for the layer at ``path``: slot 0 and the
    adapters that leave it alone are zeros, every rank zero-padded to ``rank``."""
    present = [a.layers[path] for a in adapters.values() if path in a.layers]
    n_in, n_out = present[0][0].shape[0], present[0][1].shape[1]
    dtype = present[0][0].dtype
    a_cols, b_rows = [mx.zeros((n_in, rank), dtype)], [mx.zeros((rank, n_out), dtype)]
    for adapter in adapters.values():
        a, b = adapter.layers.get(path, (mx.zeros((n_in, rank), dtype), mx.zeros((rank, n_out), dtype)))
        if a.shape[0] != n_in or b.shape[1] != n_out:
            raise ModelLoadError(f"model.adapters: the adapters disagree on the shape of {path!r}")
        pad = rank - a.shape[1]
        a_cols.append(mx.pad(a, [(0, 0), (0, pad)]) if pad else a)
        b_rows.append(mx.pad(b, [(0, pad), (0, 0)]) if pad else b)
    return mx.concatenate(a_cols, axis=1), mx.concatenate(b_rows, axis=0)
