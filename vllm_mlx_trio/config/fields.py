"""Field checks for the configuration classes: strict types, ranges, choices, defaults.

Each check raises :class:`_FieldError`, which ``config/load.py`` turns into one ConfigError line
naming the option and where its value came from.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Sequence
from typing import Any

import attrs

#: The demo models' names, as worker/demo/table.py builds them (a test keeps the two in step).
DEMO_SIZES = (
    "tiny",
    "small",
    "vlm-tiny",
    "vlm-deep-tower",
    "vlm-qwen2_5_vl",
    "vlm-qwen3_vl",
    "vlm-qwen3_vl_moe",
    "vlm-qwen3_5",
    "vlm-qwen3_5_moe",
    "vlm-llava",
    "vlm-llava_next",
    "vlm-gemma3",
    "vlm-gemma4",
    "vlm-mistral3",
    "vlm-pixtral",
    "vlm-smolvlm",
    "vlm-idefics3",
    "vlm-mtp-tiny",
    "spec-target",
    "spec-draft",
    "mtp-tiny",
    "mtp-dsv3",
    "mtp-tiny-q4",
    "mtp-tiny-q8",
    "mtp-dsv3-q4",
    "mtp-dsv3-q8",
    "smollm2",
    "embed-tiny",
)


class _FieldError(ValueError):
    """A field validator's complaint; carries the owning class so the message can be prefixed."""

    def __init__(self, owner: type, name: str, reason: str):
        super().__init__(f"{name}: {reason}")
        self.owner, self.name, self.reason = owner, name, reason


class _ConflictError(ValueError):
    """Options that do not fit together; ``keys`` are each one's (owning class, field name), so the
    message can say where their values came from."""

    def __init__(self, keys: tuple[tuple[type, str], ...], message: str):
        super().__init__(message)
        self.keys, self.message = keys, message


def _kind(tp: Any) -> tuple[Any, bool]:
    """Split a field type into (base type, optional?): ``int | None`` -> (int, True)."""
    if isinstance(tp, types.UnionType):
        args = [a for a in tp.__args__ if a is not type(None)]
        return args[0], len(args) < len(tp.__args__)
    return tp, False


def _describe(value: Any) -> str:
    """``str ('abc')``: the type name and a short repr, for "got ..." messages."""
    if value is None:
        return "None"
    if isinstance(value, tuple):  # array fields hold tuples; show what the file said
        value = list(value)
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} ({text})"


def _typed(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Strict type check: a bool is not an int, a string is never coerced."""
    kind, optional = _kind(attribute.type)
    if value is None and optional:
        return
    if kind == tuple[tuple[str, str], ...]:  # a TOML table of strings, as (key, value) pairs
        ok = isinstance(value, tuple) and all(isinstance(k, str) and isinstance(v, str) for k, v in value)
        expected = "table of strings"
    elif typing.get_origin(kind) is tuple:  # tuple[str, ...]: a TOML array of strings
        ok = isinstance(value, tuple) and all(isinstance(v, str) for v in value)
        expected = "array of strings"
    else:
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        expected = kind.__name__
    if not ok:
        expected += " or none" if optional else ""
        reason = f"expected {expected}, got {_describe(value)}"
        raise _FieldError(type(inst), attribute.name, reason)


def _in_range(low: float, high: float | None = None):
    """Validator: ``low <= value`` (and ``value <= high`` when given); None passes, NaN fails."""
    bound = f">= {low}" if high is None else f"between {low} and {high}"

    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is not None and not (low <= value and (high is None or value <= high)):
            raise _FieldError(type(inst), attribute.name, f"must be {bound}, got {value!r}")

    return check


def _one_of(choices: Sequence[str], why: str = ""):
    """Validator: the value is one of ``choices``."""

    def check(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            allowed = "one of " + ", ".join(choices) if len(choices) > 1 else repr(next(iter(choices)))
            raise _FieldError(type(inst), attribute.name, f"must be {allowed}{why}, got {value!r}")

    return check


def _non_empty(inst: Any, attribute: attrs.Attribute, value: Any) -> None:
    """Validator: a string, when given, is not empty."""
    if value is not None and not value.strip():
        raise _FieldError(type(inst), attribute.name, "must not be empty")


def _model_path(inst: Any, attribute: attrs.Attribute, value: str) -> None:
    """Validator: ``demo:<size>`` names a built-in size."""
    if value.startswith("demo:") and value[5:] not in DEMO_SIZES:
        sizes = ", ".join(f"demo:{s}" for s in DEMO_SIZES)
        raise _FieldError(type(inst), attribute.name, f"must be one of {sizes}, got {value!r}")


def _to_float(value: Any) -> Any:
    """Converter for float fields: an int is accepted (and widened); anything else is left."""
    return float(value) if type(value) is int else value


def _to_tuple(value: Any) -> Any:
    """Converter for array fields: a list becomes a tuple (frozen); anything else is left."""
    return tuple(value) if isinstance(value, list) else value


def _aliases(inst: Any, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    """Validator: each alias is a non-empty string, and none is given twice."""
    for alias in value:
        if not isinstance(alias, str) or not alias.strip():
            raise _FieldError(type(inst), attribute.name, f"each alias must be a non-empty string, got {alias!r}")
    if len(set(value)) != len(value):
        raise _FieldError(type(inst), attribute.name, f"an alias is given twice in {list(value)!r}")


def _origins(inst: Any, attribute: attrs.Attribute, value: tuple[str, ...]) -> None:
    """Validator: each CORS origin is "*" or ``scheme://host[:port]`` with no path."""
    for origin in value:
        scheme, sep, rest = origin.partition("://")
        if origin != "*" and not (scheme in ("http", "https") and sep and rest and "/" not in rest):
            reason = f"each origin must be '*' or like 'https://example.com', got {origin!r}"
            raise _FieldError(type(inst), attribute.name, reason)


def _option(default: Any, *checks: Any, converter: Any = None) -> Any:
    """An attrs field with a default, the strict type check and any further checks."""
    return attrs.field(default=default, validator=[_typed, *checks], converter=converter)
