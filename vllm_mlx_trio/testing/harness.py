"""Helpers to run the real engine on a :class:`FakeExecutor` inside a test."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs

from ..config import EngineConfig, load_config
from ..engine import Engine, open_engine
from .fake_executor import FakeExecutor


@attrs.define
class FakeEngine:
    """An engine plus the fake executor behind it (to inspect plans and live sequences)."""

    engine: Engine
    executor: FakeExecutor


@contextlib.asynccontextmanager
async def open_fake_engine(
    cfg: EngineConfig | None = None, *, overrides: tuple[str, ...] = (), **fake_kwargs: Any
) -> AsyncIterator[FakeEngine]:
    """``open_engine`` on a FakeExecutor built with ``fake_kwargs`` (script, gate, step_s...)."""
    cfg = cfg or load_config(None, overrides=overrides, environ={})
    holder: list[FakeExecutor] = []

    def factory(plan_recv, result_send):
        holder.append(FakeExecutor(plan_recv, result_send, **fake_kwargs))
        return holder[0]

    async with open_engine(cfg, executor_factory=factory) as engine:
        yield FakeEngine(engine=engine, executor=holder[0])
