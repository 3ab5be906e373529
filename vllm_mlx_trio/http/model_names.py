"""Which ``model`` names a request may send, and the name its reply echoes."""

from __future__ import annotations

import attrs

from vllm_mlx_trio.config import EngineConfig
from vllm_mlx_trio.errors import ModelNotFoundError


@attrs.frozen
class ServedNames:
    """The names the model is served under; with ``accept_any``, any name is answered."""

    names: tuple[str, ...]
    accept_any: bool = False

    @classmethod
    def from_config(cls, cfg: EngineConfig) -> ServedNames:
        return cls(cfg.served_names, cfg.server.accept_any_model_name)

    def resolve(self, requested: str) -> str:
        """The name the reply carries: the one the request sent, once it is known (else 404)."""
        if requested in self.names or self.accept_any:
            return requested
        raise ModelNotFoundError(requested)
