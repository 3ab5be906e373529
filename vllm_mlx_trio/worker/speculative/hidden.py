"""The target's forward with its hidden states (for drafters that need them), and the hidden-state mode.

``post_norm`` hands the drafter the hidden state after the target's final norm (what the head sees; Qwen3.5 /
Qwen3.6 MTP heads were trained on it), ``pre_norm`` the residual stream before it (what mlx-vlm's
DeepSeek-V4 MTP reads; vLLM feeds DeepSeek-V3's MTP layer ``post_norm``).
Which one a model wants is contested upstream; a wrong choice only lowers acceptance, never changes the output,
because the target verifies every draft. MLX thread only.
"""

from __future__ import annotations

import logging
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .mtp.head import text_config_of

logger = logging.getLogger(__name__)

POST_NORM = "post_norm"
PRE_NORM = "pre_norm"
HIDDEN_STATE_MODES = (POST_NORM, PRE_NORM)
#: The key in a model's ``text_config`` (or top-level config) naming its mode.
MODEL_CONFIG_KEY = "mtp_hidden_state_mode"

_warned_unknown: set[str] = set()


def resolve_hidden_state_mode(override: str | None, model_config: dict[str, Any]) -> str:
    """The mode to use: the config override, else the model's ``mtp_hidden_state_mode``, else ``post_norm``.

    An unknown value logs one WARNING (once per value per process) and falls back to ``post_norm``.
    """
    text = text_config_of(model_config)
    source, value = "[speculative] hidden_state_mode", override or None
    if value is None:
        source = f"the model's {MODEL_CONFIG_KEY}"
        value = text.get(MODEL_CONFIG_KEY) or model_config.get(MODEL_CONFIG_KEY)
    if value is None:
        return POST_NORM
    if value in HIDDEN_STATE_MODES:
        return value
    if value not in _warned_unknown:
        _warned_unknown.add(value)
        logger.warning("unknown hidden-state mode %r (from %s); using %s", value, source, POST_NORM)
    return POST_NORM


class _FinalNormTap(nn.Module):
    """Stands in for the target's final norm for one forward and keeps its input and output."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm
        self.pre: mx.array | None = None
        self.post: mx.array | None = None

    def __call__(self, x: mx.array) -> mx.array:
        self.pre = x
        self.post = self.norm(x)
        return self.post


def final_norm_owner(model: Any) -> nn.Module:
    """The module whose ``norm`` is the target's final norm (mlx-lm models: ``model.model``)."""
    for candidate in (getattr(model, "model", None), getattr(getattr(model, "language_model", None), "model", None)):
        if isinstance(candidate, nn.Module) and isinstance(getattr(candidate, "norm", None), nn.Module):
            return candidate
    raise TypeError(f"{type(model).__name__}: no final norm found (expected model.model.norm)")


def target_forward(model: Any, inputs: mx.array, cache: Any, *, mode: str) -> tuple[mx.array, mx.array]:
    """``model(inputs, cache=cache)`` returning ``(logits, hidden)``, hidden ``(B, L, hidden_size)`` in ``mode``.

    The logits are those of the plain forward (the same graph runs); the hidden states are read at the final norm.
    """
    if mode not in HIDDEN_STATE_MODES:
        raise ValueError(f"unknown hidden-state mode {mode!r}; expected one of {HIDDEN_STATE_MODES}")
    owner = final_norm_owner(model)
    tap = _FinalNormTap(owner.norm)
    owner.norm = tap
    try:
        logits = model(inputs, cache=cache)
    finally:
        owner.norm = tap.norm
    hidden = tap.pre if mode == PRE_NORM else tap.post
    assert hidden is not None, "the model's forward did not pass its final norm"
    return logits, hidden
