"""Which ``model`` names a request may send, and the name its reply echoes."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from vllm_mlx_trio.config import EngineConfig
from vllm_mlx_trio.errors import ModelNotFoundError


@attrs.frozen
class ServedNames:
    """The names the model is served under; with ``accept_any``, any name is answered.
    ``adapters``: each named adapter's served name (``<served name>:<adapter>``) -> the adapter."""

    names: tuple[str, ...]
    accept_any: bool = False
    adapters: Mapping[str, str] = attrs.field(factory=dict)

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> ServedNames:
        return cls(cfg.served_names, cfg.server.accept_any_model_name, cfg.adapter_names)

    def resolve(self, requested: str) -> str:
        """The name the reply carries: the one the request sent, once it is known (else 404).
        A name shaped like one of our adapters' that names none is a 404 even with ``accept_any``."""
        if requested in self.names or requested in self.adapters:
            return requested
        if self.accept_any and not self._unknown_adapter(requested):
            return requested
        raise ModelNotFoundError(requested)

    def adapter(self, requested: str) -> str | None:
        """The adapter a (resolved) name runs with; None: the base model."""
        return self.adapters.get(requested)

    def _unknown_adapter(self, requested: str) -> bool:
        base, sep, _ = requested.rpartition(":")
        return bool(self.adapters) and bool(sep) and base in self.names
