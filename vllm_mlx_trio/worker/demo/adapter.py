"""Demo LoRA adapters (``[model] adapter_path = "demo:<name>"``), in mlx-lm's own adapter format.

An adapter folder holds ``adapter_config.json`` (``fine_tune_type``, ``num_layers``,
``lora_parameters``: rank, scale, dropout) and ``adapters.safetensors`` (each adapted linear
layer's ``lora_a`` and ``lora_b``), what ``mlx_lm.lora`` training writes and
``mlx_lm.load(path, adapter_path=...)`` reads. ``tiny-lora`` adapts every linear layer of
``demo:tiny`` with random low-rank weights, drawn from ``numpy.random.default_rng(seed)``, large
enough to change its greedy output; ``tiny-lora-b`` is another (seed 1), to serve beside it;
``small-lora`` and ``small-lora-b`` are the same for ``demo:small``. Built once into the demo cache,
like the models.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from .files import write_json
from .recipe import DEMO_MARKER, DEMO_PREFIX, build_into, default_demo_cache_dir
from .table import resolve_demo_model

#: Bumped when an adapter's files change: a new version is a new build.
ADAPTER_FORMAT_VERSION = 1
#: Each demo adapter by name: the demo model it adapts.
DEMO_ADAPTERS: Mapping[str, str] = MappingProxyType(
    {"tiny-lora": "demo:tiny", "tiny-lora-b": "demo:tiny", "small-lora": "demo:small", "small-lora-b": "demo:small"}
)
#: Each demo adapter's seed: different adapters of one model have different weights.
ADAPTER_SEEDS: Mapping[str, int] = MappingProxyType(
    {"tiny-lora": 0, "tiny-lora-b": 1, "small-lora": 0, "small-lora-b": 1}
)
LORA_PARAMETERS = {"rank": 4, "scale": 2.0, "dropout": 0.0}
#: The standard deviation of ``lora_b`` (training starts it at zero; random here, so the
#: adapter visibly changes the model).
LORA_B_STD = 0.05


def resolve_demo_adapter(path: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """The folder of the demo adapter ``path`` ("demo:<name>"), built (its seed, :data:`ADAPTER_SEEDS`) on first
    use into ``<cache_dir>/adapters/<name>-seed<seed>-v<version>``; ``ValueError`` for an unknown name."""
    name = path[len(DEMO_PREFIX) :]
    if not path.startswith(DEMO_PREFIX) or name not in DEMO_ADAPTERS:
        valid = ", ".join(f"{DEMO_PREFIX}{n}" for n in DEMO_ADAPTERS)
        raise ValueError(f"unknown demo adapter {path!r}; valid: {valid}")
    root = pathlib.Path(cache_dir) if cache_dir is not None else default_demo_cache_dir()
    seed = ADAPTER_SEEDS[name]
    target = root / "adapters" / f"{name}-seed{seed}-v{ADAPTER_FORMAT_VERSION}"
    if (target / DEMO_MARKER).is_file():
        return target
    base = resolve_demo_model(DEMO_ADAPTERS[name], cache_dir)

    def write(directory: pathlib.Path, *, seed: int, dtype: str) -> None:
        write_lora_adapter(directory, base, seed=seed)
        write_json(directory / DEMO_MARKER, {"adapter": name, "base": DEMO_ADAPTERS[name], "seed": seed})

    return build_into(target, write, seed=seed, dtype="float32", replace=False)


def write_lora_adapter(directory: pathlib.Path, base: pathlib.Path, *, seed: int) -> None:
    """A random LoRA adapter over every linear layer of the model in ``base``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = load(str(base))
    num_layers = len(model.layers)
    linear_to_lora_layers(model, num_layers, dict(LORA_PARAMETERS))
    rng = np.random.default_rng(seed)
    weights = {}
    for name, param in sorted(tree_flatten(model.parameters())):
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "lora_a":
            weights[name] = rng.standard_normal(param.shape, dtype=np.float32) * np.float32(param.shape[0] ** -0.5)
        elif leaf == "lora_b":
            weights[name] = rng.standard_normal(param.shape, dtype=np.float32) * np.float32(LORA_B_STD)
    mx.save_safetensors(str(directory / "adapters.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    config = {"fine_tune_type": "lora", "num_layers": num_layers, "lora_parameters": LORA_PARAMETERS}
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
