"""Runner kinds, registered by name: ``engine.mode`` picks one.

Importing this module imports no MLX: each entry names its runner class as
``"package.module:Class"``, imported the first time the kind is used. Adding a kind is one
new module (a class satisfying :class:`Runner`) plus one line in :data:`RUNNERS`, or a call
to :func:`register_runner` from the program that embeds the engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from ..config.sections import EngineConfig, EngineSection
    from ..messages import ModelInfo, StepPlan, StepResult

#: name -> "module:Class". Ordered: the first is listed first in errors and docs.
RUNNERS: dict[str, str] = {
    "simple": "vllm_mlx_trio.worker.simple_runner:SimpleRunner",
    "batched": "vllm_mlx_trio.worker.batched.runner:BatchRunner",
    # one model sharded over mlx.launch's ranks, each running "batched" on its shard (docs/distributed.md)
    "distributed": "vllm_mlx_trio.worker.distributed_runner:DistributedRunner",
    # a vision-language model (mlx-vlm, the vlm extra) batched with text (worker/vlm/runner.py)
    "vlm": "vllm_mlx_trio.worker.vlm.runner:VlmRunner",
    # "batched" plus draft -> verify rounds for a request alone in the batch; selected by speculative.method
    "speculative": "vllm_mlx_trio.worker.speculative.runner:SpecRunner",
}
#: The kind ``speculative.method`` (when not "off") runs instead of "batched".
SPECULATIVE = "speculative"


class Runner(Protocol):
    """What the executor thread drives: built, loaded, stepped and closed on that thread.

    Class attributes tell the scheduler how to drive it, without loading anything.
    """

    #: Plans the scheduler keeps outstanding on the executor edge (1 is lock-step).
    plans_in_flight: ClassVar[int]
    #: Most tokens one step may produce for one sequence (speculative steps give several).
    max_tokens_per_step: ClassVar[int]

    def __init__(self, cfg: EngineConfig) -> None: ...

    @classmethod
    def max_running(cls, engine: EngineSection) -> int:
        """Sequences this runner holds at once under these settings."""
        ...

    def load(self) -> ModelInfo: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def close(self) -> None: ...


def register_runner(name: str, target: str | type) -> None:
    """Make ``engine.mode = name`` run ``target`` (a class, or ``"module:Class"``)."""
    if isinstance(target, type):
        target = f"{target.__module__}:{target.__qualname__}"
    RUNNERS[name] = target


def runner_for(cfg: EngineConfig) -> type[Runner]:
    """The runner class a configuration runs: ``engine.mode``'s, or the speculative runner in place of "batched"
    when ``speculative.method`` is not "off" (configured for it: its ``max_tokens_per_step``)."""
    from ..errors import ConfigError

    name, method = cfg.engine.mode, cfg.speculative.method
    if method != "off" and name not in ("batched", SPECULATIVE):
        raise ConfigError(f'speculative.method = "{method}" needs engine.mode = "batched", not {name!r}')
    if name == SPECULATIVE and method == "off":
        raise ConfigError('engine.mode = "speculative" needs speculative.method = "draft" or "mtp"')
    cls = runner_class(SPECULATIVE if method != "off" else name)
    configured = getattr(cls, "configured", None)
    return configured(cfg) if configured is not None else cls


def runner_class(name: str) -> type[Runner]:
    """The runner class registered as ``name`` (imports its module on first use)."""
    try:
        target = RUNNERS[name]
    except KeyError:
        raise ValueError(f"unknown runner kind {name!r}; registered: {', '.join(RUNNERS)}") from None
    module_name, _, class_name = target.partition(":")
    return getattr(importlib.import_module(module_name), class_name)
