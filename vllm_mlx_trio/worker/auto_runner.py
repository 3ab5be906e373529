"""``engine.mode = "auto"`` (the default): the runner the model's ``config.json`` calls for.

A model whose ``config.json`` declares a vision or audio tower (worker/modality.py) is served
by the vlm runner, its text-only requests in the same batch as its media requests; any other
model by the batched runner. The choice is made when the executor builds its runner, on the
executor's thread (a hub model's config.json may have to be downloaded first): ``AutoRunner(cfg)``
is an instance of the chosen runner class, so nothing stands between the executor and it.
Until then the scheduler drives the batched runner's shape, which the vlm runner (a batched
runner) shares. ``ModelInfo.runner_kind`` says which one serves.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..runner_kinds import BATCHED, VLM, RunnerShape
from .modality import declared_towers, read_model_config

if TYPE_CHECKING:
    from ..config.sections import EngineConfig

logger = logging.getLogger(__name__)


def auto_kind(cfg: EngineConfig) -> str:
    """ "vlm" when the configured model declares a tower, else "batched" (may download config.json)."""
    from .loading import resolve_or_fail

    path = resolve_or_fail(cfg.model)
    towers = declared_towers(read_model_config(path, revision=cfg.model.revision))
    return VLM if towers else BATCHED


class AutoRunner:
    """Builds the batched or the vlm runner, chosen from the model's config.json."""

    @classmethod
    def shape(cls, cfg: EngineConfig) -> RunnerShape:
        from .batched.runner import BatchRunner

        return BatchRunner.shape(cfg)  # the vlm runner is a batched runner: the same shape

    def __new__(cls, cfg: EngineConfig, *, request_waiting: threading.Event | None = None) -> Any:
        from .registry import runner_class

        kind = auto_kind(cfg)
        logger.debug("engine.mode = 'auto': model %r runs in %r mode", cfg.model.path, kind)  # the ready line says it
        return runner_class(kind)(cfg, request_waiting=request_waiting)
