"""A ``[[models]]`` server over fake engines, for tests of loading on demand and eviction.

:class:`FakeModels` opens each model's engine on a FakeExecutor: a model whose ``gates`` entry
is set loads until that event is set, a model whose path starts with ``/nonexistent`` fails to
load (as a bad path does), and each loaded model weighs ``footprints[name]`` bytes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import trio

from ..config import EngineConfig, config_from_dict
from ..engine import Engine, open_engine
from ..errors import ModelLoadError
from ..models.serve import serve_models
from .fake_executor import FakeExecutor, SlowLoadingExecutor, StepGate, text_script

MIB = 1024 * 1024
#: The path prefix :class:`FakeModels` fails to load.
BAD_PATH = "/nonexistent"


@attrs.define
class FakeModels:
    """The engine opener and footprint measure of a fake ``[[models]]`` server."""

    #: Model name -> the event its load waits for (none: it loads at once).
    gates: dict[str, trio.Event] = attrs.Factory(dict)
    #: Model name -> the bytes it weighs once loaded (default 1 MiB).
    footprints: dict[str, int] = attrs.Factory(dict)
    #: Model names, each time one is opened.
    opened: list[str] = attrs.Factory(list)
    #: Model name -> set when its load has begun.
    loading: dict[str, trio.Event] = attrs.Factory(dict)
    #: Model name -> the gate its steps wait at (none: they run every millisecond).
    step_gates: dict[str, StepGate] = attrs.Factory(dict)

    @contextlib.asynccontextmanager
    async def open(self, cfg: EngineConfig) -> AsyncIterator[Engine]:
        name = cfg.model_name
        self.opened.append(name)
        self.loading.setdefault(name, trio.Event()).set()
        if cfg.model.path.startswith(BAD_PATH):
            raise ModelLoadError(f"could not load model {cfg.model.path!r}: no such directory")
        script = text_script(f"I am {name}.")
        gate = self.gates.get(name)
        steps = {"script": script, "step_s": 0.001, "gate": self.step_gates.get(name)}

        def factory(plan_recv, result_send):
            if gate is None:
                return FakeExecutor(plan_recv, result_send, **steps)
            return SlowLoadingExecutor(plan_recv, result_send, loaded=gate, **steps)

        async with open_engine(cfg, executor_factory=factory) as engine:
            yield engine

    def measure(self, engine: Engine) -> int:
        return self.footprints.get(engine.cfg.model_name, MIB)


def models_cfg(models: Sequence[dict[str, Any]], *, memory_mb: int = 1000, **server: Any) -> EngineConfig:
    """A configuration of ``models`` (``[[models]]`` tables) on a free port."""
    return config_from_dict(
        {
            "server": {"port": 0, "drain_timeout_s": 5, "model_memory_mb": memory_mb, **server},
            "models": list(models),
        }
    )


@contextlib.asynccontextmanager
async def models_server(cfg: EngineConfig, fakes: FakeModels) -> AsyncIterator[str]:
    """``serve_models`` on 127.0.0.1 over ``fakes``; yields its URL, stops on leaving."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        serve = functools.partial(
            serve_models, cfg, shutdown_trigger=stop.wait, opener=fakes.open, measure=fakes.measure
        )
        binds = await nursery.start(serve)
        try:
            yield binds[0]
        finally:
            stop.set()
