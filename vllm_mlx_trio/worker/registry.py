"""The runner table: each kind ``engine.mode`` names, with a loader of its runner class.

Importing this module imports no MLX: each loader imports its runner's module when called,
so only the kind that runs is loaded. The table is passed in, never changed in place: a
program that embeds the engine runs its own kinds with
``open_engine(cfg, runners=with_runner("mine", MyRunner))``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol

from ..errors import ConfigError
from ..runner_kinds import (
    AUTO,
    BATCHED,
    DISTRIBUTED,
    EMBED,
    SIMPLE,
    SPECULATIVE,
    VLM,
    VLM_SPECULATIVE,
    RunnerShape,
    kind_for,
)

if TYPE_CHECKING:
    import threading

    from ..config.sections import EngineConfig
    from ..messages import ModelInfo, StepPlan, StepResult


class Runner(Protocol):
    """What the executor thread drives: built, loaded, stepped and closed on that thread.

    :meth:`shape` tells the scheduler how to drive it, without loading anything. The executor
    sets ``publish`` once the runner is loaded: a runner that runs several steps in one plan
    hands each earlier step's tokens to it (a ``StepResult`` with ``plan_continues``) as the
    step ends; one that does not never calls it.
    """

    publish: Callable[[StepResult], None] | None

    def __init__(self, cfg: EngineConfig, *, request_waiting: threading.Event | None = None) -> None:
        """``request_waiting`` is set by the executor while a request waits for the next plan
        boundary (a runner that runs ahead within a plan stops for it)."""
        ...

    @classmethod
    def shape(cls, cfg: EngineConfig) -> RunnerShape:
        """Plans in flight, tokens per step and sequences held at once under ``cfg``."""
        ...

    def load(self) -> ModelInfo: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def close(self) -> None: ...


#: Imports and returns a runner class.
RunnerLoader = Callable[[], type[Runner]]
#: Kind name -> the loader of its runner class.
RunnerTable = Mapping[str, RunnerLoader]


def _auto() -> type[Runner]:
    from .auto_runner import AutoRunner

    return AutoRunner


def _simple() -> type[Runner]:
    from .simple_runner import SimpleRunner

    return SimpleRunner


def _batched() -> type[Runner]:
    from .batched.runner import BatchRunner

    return BatchRunner


def _distributed() -> type[Runner]:
    from .distributed_runner import DistributedRunner

    return DistributedRunner


def _vlm() -> type[Runner]:
    from .vlm.runner import VlmRunner

    return VlmRunner


def _speculative() -> type[Runner]:
    from .speculative.runner import SpecRunner

    return SpecRunner


def _vlm_speculative() -> type[Runner]:
    from .vlm.speculative import VlmSpecRunner

    return VlmSpecRunner


def _embed() -> type[Runner]:
    from .embed.runner import EmbedRunner

    return EmbedRunner


#: The kinds the engine ships (read-only). Ordered: the first is listed first in errors and docs.
RUNNERS: RunnerTable = MappingProxyType(
    {
        AUTO: _auto,
        SIMPLE: _simple,
        BATCHED: _batched,
        DISTRIBUTED: _distributed,
        VLM: _vlm,
        SPECULATIVE: _speculative,
        VLM_SPECULATIVE: _vlm_speculative,
        EMBED: _embed,
    }
)


def with_runner(name: str, runner: type[Runner], runners: RunnerTable = RUNNERS) -> RunnerTable:
    """A new table: ``runners`` plus the kind ``name`` running ``runner`` (``engine.mode = name``)."""
    return MappingProxyType({**runners, name: lambda: runner})


def runner_for(cfg: EngineConfig, runners: RunnerTable = RUNNERS) -> type[Runner]:
    """The runner class a configuration runs: ``engine.mode``'s, or its kind with speculation
    ("speculative" for "batched", "vlm-speculative" for "vlm") when ``speculative.method`` is not "off"."""
    runner = runner_class(kind_for(cfg.engine.mode, cfg.speculative.method), runners)
    bound = getattr(runner, "bound", None)  # the auto kind: it looks the kind it picks up in the same table
    return bound(runners) if bound is not None else runner


def runner_class(name: str, runners: RunnerTable = RUNNERS) -> type[Runner]:
    """The runner class of the kind ``name`` in ``runners`` (imports its module on first use)."""
    try:
        load = runners[name]
    except KeyError:
        raise ConfigError(f"engine.mode: must be one of {', '.join(runners)}, got {name!r}") from None
    return load()
