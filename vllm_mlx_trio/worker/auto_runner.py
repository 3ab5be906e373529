"""``engine.mode = "auto"`` (the default): the runner the model's ``config.json`` calls for.

A model whose ``config.json`` declares a vision or audio tower (worker/modality.py) is served
by the vlm runner, its text-only requests in the same batch as its media requests; any other
model by the batched runner. With ``speculative.method`` set, by their kinds with speculation
("vlm-speculative", "speculative"). The choice is made when the executor builds its runner, on the
executor's thread (a hub model's config.json may have to be downloaded first): ``AutoRunner(cfg)``
is an instance of the chosen runner class, so nothing stands between the executor and it.
Until then the scheduler drives the batched (or speculative) runner's shape, which the vlm
(or vlm-speculative) runner shares. ``ModelInfo.runner_kind`` says which one serves.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, ClassVar

from ..runner_kinds import BATCHED, SPECULATION_OFF, VLM, RunnerShape, kind_for
from .modality import declared_towers, read_model_config

if TYPE_CHECKING:
    from ..config.sections import EngineConfig

logger = logging.getLogger(__name__)


def auto_kind(cfg: EngineConfig) -> str:
    """ "vlm" when the configured model declares a tower, else "batched" (may download config.json);
    their kinds with speculation when ``speculative.method`` is set."""
    from .loading import resolve_or_fail

    path = resolve_or_fail(cfg.model)
    towers = declared_towers(read_model_config(path, revision=cfg.model.revision))
    return kind_for(VLM if towers else BATCHED, cfg.speculative.method)


class AutoRunner:
    """Builds the batched or the vlm runner, chosen from the model's config.json."""

    #: The runner table the chosen kind is looked up in (None: the built-in one);
    #: ``registry.runner_for`` binds the engine's own with :meth:`bound`.
    runners: ClassVar[Any] = None

    @classmethod
    def bound(cls, runners: Any) -> type[AutoRunner]:
        """This class choosing its kind's runner from ``runners``."""
        return type(cls.__name__, (cls,), {"runners": runners})

    @classmethod
    def shape(cls, cfg: EngineConfig) -> RunnerShape:
        if cfg.speculative.method != SPECULATION_OFF:
            from .speculative.runner import SpecRunner

            return SpecRunner.shape(cfg)  # the vlm-speculative runner is a speculative runner: the same shape
        from .batched.runner import BatchRunner

        return BatchRunner.shape(cfg)  # the vlm runner is a batched runner: the same shape

    def __new__(cls, cfg: EngineConfig, *, request_waiting: threading.Event | None = None, **kwargs: Any) -> Any:
        """``kwargs``: what the chosen runner class takes beside (a speculative runner's ``drafter``)."""
        from .registry import runner_class

        kind = auto_kind(cfg)
        logger.debug("engine.mode = 'auto': model %r runs in %r mode", cfg.model.path, kind)  # the ready line says it
        runner = runner_class(kind) if cls.runners is None else runner_class(kind, cls.runners)
        return runner(cfg, request_waiting=request_waiting, **kwargs)
