"""``[[models]]``: several models in one configuration, each a whole :class:`EngineConfig`.

An entry names its model (``name``), may pin it, sets any ``[model]`` key directly (``path``,
``aliases``, ``max_model_len``...) and any per-model section as a sub-table (``[models.engine]``,
``[models.cache]``, ``[models.limits]``, ``[models.speculative]``, ``[models.mllm]``). Every
other value comes from the top-level sections (the file, the environment and ``--set``), so
those are the models' defaults. ``[server]``, ``[metrics]``, ``[logging]`` and
``[distributed]`` stay the server's: an entry may not set them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from vllm_mlx_trio.config.fields import _describe
from vllm_mlx_trio.config.sections import EngineConfig, ModelConfig, ModelEntry
from vllm_mlx_trio.errors import ConfigError

#: The sections an entry may set as a sub-table (its engine, cache and request limits).
PER_MODEL_SECTIONS = ("engine", "cache", "limits", "speculative", "mllm")
#: An entry's own keys, beside ``[model]``'s.
ENTRY_KEYS = ("name", "pinned")
_MODEL_KEYS = frozenset(f.name for f in attrs.fields(ModelConfig))

#: Builds a configuration from ``{section: {key: value}}`` with its sources (load.py's ``_build``).
Build = Callable[[dict[str, dict[str, Any]], dict[tuple[str, str], str | None]], EngineConfig]


def model_entries(
    raw: Any,
    data: Mapping[str, Mapping[str, Any]],
    sources: Mapping[tuple[str, str], str | None],
    build: Build,
    origin: str | None,
) -> tuple[ModelEntry, ...]:
    """The entries of a ``models`` array over the top-level ``data`` (their defaults)."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"models: expected an array of tables ([[models]]), got {_describe(raw)}{_from(origin)}")
    entries = tuple(_entry(table, index, data, sources, build, origin) for index, table in enumerate(raw))
    _check_names_unique(entries, origin)
    _check_disk_dirs_apart(entries, origin)
    return entries


def _entry(
    table: Any,
    index: int,
    data: Mapping[str, Mapping[str, Any]],
    sources: Mapping[tuple[str, str], str | None],
    build: Build,
    origin: str | None,
) -> ModelEntry:
    where = f"models[{index}]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: expected a table, got {_describe(table)}{_from(origin)}")
    name, pinned = table.get("name"), table.get("pinned", False)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}.name: required, a non-empty string{_from(origin)}")
    if not isinstance(pinned, bool):
        raise ConfigError(f"{where}.pinned: must be bool, got {_describe(pinned)}{_from(origin)}")
    merged = copy.deepcopy({section: dict(values) for section, values in data.items()})
    merged_sources = dict(sources)
    source = f"{where} of {origin}" if origin else where
    merged.setdefault("server", {})["served_model_name"] = name
    for key, value in table.items():
        if key in ENTRY_KEYS:
            continue
        if key in _MODEL_KEYS:
            merged.setdefault("model", {})[key] = value
            merged_sources[("model", key)] = source
        elif key in PER_MODEL_SECTIONS and isinstance(value, Mapping):
            for sub_key, sub_value in value.items():
                merged.setdefault(key, {})[str(sub_key)] = sub_value
                merged_sources[(key, str(sub_key))] = source
        else:
            raise _unknown(where, str(key), origin)
    return ModelEntry(name=name, pinned=pinned, config=build(merged, merged_sources), table=dict(table))


def _unknown(where: str, key: str, origin: str | None) -> ConfigError:
    keys = ", ".join((*ENTRY_KEYS, "any [model] key", *(f"[models.{s}]" for s in PER_MODEL_SECTIONS)))
    return ConfigError(f"{where}: unknown key '{key}' (an entry takes {keys}){_from(origin)}")


def _check_names_unique(entries: Sequence[ModelEntry], origin: str | None) -> None:
    """No name or alias is served by two entries."""
    owner: dict[str, int] = {}
    for index, entry in enumerate(entries):
        for served in entry.config.served_names:
            if owner.setdefault(served, index) != index:
                first = entries[owner[served]].name
                raise ConfigError(
                    f"models: the name {served!r} is served by both {first!r} and {entry.name!r}{_from(origin)}"
                )


def _check_disk_dirs_apart(entries: Sequence[ModelEntry], origin: str | None) -> None:
    """Each model's prefix-cache disk tier in a directory of its own: the tier deletes the
    files of another model it finds there."""
    owner: dict[str, str] = {}
    for entry in entries:
        disk_dir = entry.config.cache.disk_dir
        if disk_dir is not None and owner.setdefault(disk_dir, entry.name) != entry.name:
            raise ConfigError(
                f"models: {owner[disk_dir]!r} and {entry.name!r} share cache.disk_dir {disk_dir!r}; "
                f"give each model its own ([models.cache] disk_dir){_from(origin)}"
            )


def _from(origin: str | None) -> str:
    return f" (from {origin})" if origin else ""
