"""The model registry: the ``[[models]]`` of a configuration, each loaded when first asked for
and unloaded when the memory budget needs its room.

Each model is a :class:`ModelSlot`. A loaded model is one engine (``open_engine``: its own
actors and its own MLX thread), held open by a task in the registry's nursery until it is
asked to unload; leaving the engine drops its prefix cache with it. A loading model reserves
its last footprint (or an estimate) until it is measured, so the budget decisions
(core/model_budget.py) see every loaded and loading model. A request takes
a :class:`Lease` on its model: it waits while the model loads (at most ``limits.max_waiting``
requests per model wait; more get a 429), and a leased model is never unloaded to make room.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from ..config import EngineConfig, ModelEntry
from ..core.model_budget import Resident, make_room
from ..engine import Engine
from ..errors import ModelNotFoundError, ModelUnavailableError, QueueFullError, VllmMlxTrioError
from ..logs import logfmt_value
from .footprint import MIB, estimated_footprint, loaded_footprint

logger = logging.getLogger(__name__)

#: Opens a model's engine (``open_engine`` with the executor ``server.model_steps`` asks for).
EngineOpener = Callable[[EngineConfig], AbstractAsyncContextManager[Engine]]


class ModelState(enum.StrEnum):
    NOT_LOADED = "not_loaded"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    FAILED = "failed"


class ModelSlot:
    """One model of ``[[models]]``: its state, and its engine while loaded."""

    def __init__(self, entry: ModelEntry):
        self.entry = entry
        self.state = ModelState.NOT_LOADED
        self.engine: Engine | None = None
        #: What serves its HTTP requests while loaded (built by the registry's ``serving``).
        self.serving: Any = None
        self.leases = 0
        self.waiting = 0
        self.last_used = -math.inf
        #: Weights plus KV in bytes, measured at its last load (None before the first).
        self.footprint: int | None = None
        self.error: VllmMlxTrioError | None = None
        self.loading_since: float | None = None
        #: Bytes held for it while it loads (its last footprint, or the estimate).
        self.reserved = 0
        #: While loading: "making_room" (waiting for models to unload or become idle),
        #: "loading" (the engine opening), "measuring"; None otherwise.
        self.load_phase: str | None = None
        #: How many of its loads have ended (unloaded or failed): a waiter's load is over when it grows.
        self.ended = 0
        self._unload = trio.Event()

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def busy(self) -> bool:
        return bool(self.leases or self.waiting)

    def resident(self) -> Resident:
        """As the budget sees it; a loading model holds its reservation and cannot leave."""
        loading = self.state is ModelState.LOADING
        return Resident(
            name=self.name,
            footprint=self.reserved if loading else self.footprint or 0,
            last_used=self.last_used,
            busy=self.busy or loading,
            pinned=self.entry.pinned,
        )


class Lease:
    """A request's hold on a loaded model: ``serving`` answers it; release it when done."""

    def __init__(self, registry: ModelRegistry, slot: ModelSlot):
        self._registry, self.slot = registry, slot
        self.serving = slot.serving
        self.engine = slot.engine

    def release(self) -> None:
        self._registry._release(self.slot)


class ModelRegistry:
    """The models of ``cfg.models``, loaded on demand within ``budget`` bytes.

    ``serving(engine, entry)`` builds what answers a loaded model's requests (the HTTP app);
    ``measure(engine)`` gives a loaded model's footprint in bytes.
    """

    def __init__(
        self,
        cfg: EngineConfig,
        *,
        budget: int,
        opener: EngineOpener,
        serving: Callable[[Engine, ModelEntry], Any] = lambda engine, entry: None,
        measure: Callable[[Engine], int] = loaded_footprint,
        estimate: Callable[[EngineConfig], int] = estimated_footprint,
    ):
        self.cfg = cfg
        self.budget = budget
        self.slots = tuple(ModelSlot(entry) for entry in cfg.models)
        # a model's named adapters (``<name>:<adapter>``) are answered by that model's engine
        self._by_name = {
            name: slot
            for slot in self.slots
            for name in (*slot.entry.config.served_names, *slot.entry.config.adapter_names)
        }
        self._opener, self._serving, self._measure, self._estimate = opener, serving, measure, estimate
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._stopped = trio.Event()

    # --- running ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the loaded models' engines; the pinned ones are loaded first. Returns after
        :meth:`unload_all` (or when cancelled: the engines are abandoned at once)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for slot in self.slots:
                if slot.entry.pinned:
                    self._start_load(slot)
            for slot in self.slots:
                if slot.entry.pinned:
                    await self._wait_settled(slot)
            task_status.started()
            await self._stopped.wait()

    async def unload_all(self, timeout_s: float) -> None:
        """Unload every model, each after the requests inside it finish (at most ``timeout_s``
        in all), and end ``run``; a load still under way is abandoned."""
        for slot in self.slots:
            slot._unload.set()
        self._stopped.set()
        holding = (ModelState.LOADED, ModelState.UNLOADING)
        with trio.move_on_after(timeout_s):
            for slot in self.slots:
                while slot.state in holding:
                    await self._wait_change()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    # --- requests ---------------------------------------------------------------------------

    def slot_for(self, model: str | None) -> ModelSlot:
        """The slot serving ``model``; with ``server.accept_any_model_name`` an unknown name
        (or none) gets the first model's; else an unknown name is a 404."""
        slot = self._by_name.get(model) if model is not None else None
        if slot is not None:
            return slot
        if self.cfg.server.accept_any_model_name or model is None:
            return self.slots[0]
        raise ModelNotFoundError(model)

    def slot_for_name(self, name: str) -> ModelSlot:
        """The slot serving ``name`` exactly (a 404 otherwise, whatever accept_any_model_name says)."""
        slot = self._by_name.get(name)
        if slot is None:
            raise ModelNotFoundError(name)
        return slot

    def loaded_bytes(self) -> int:
        """The footprints of the models holding memory now (with the loading ones' reservations)."""
        return sum(r.footprint for r in self._others(None))

    async def acquire(self, slot: ModelSlot) -> Lease:
        """A lease on ``slot``'s model, loading it first when it is not loaded.

        Raises :class:`QueueFullError` when ``limits.max_waiting`` requests (at least one)
        already wait for it, and :class:`ModelUnavailableError` when its load fails or it can never fit.
        Cancelling the wait leaves the load going for the others.
        """
        if slot.state is ModelState.LOADED and not slot._unload.is_set():
            return self._lease(slot)
        if slot.waiting >= max(1, slot.entry.config.limits.max_waiting):  # 0 would never let it load
            raise QueueFullError(f"{slot.waiting} requests already wait for model {slot.name!r} to load; retry later.")
        slot.waiting += 1
        try:
            return await self._wait_loaded(slot)
        finally:
            slot.waiting -= 1
            self._notify()

    async def _wait_loaded(self, slot: ModelSlot) -> Lease:
        started_load = None
        while True:
            if slot.state is ModelState.LOADED and not slot._unload.is_set():
                return self._lease(slot)
            if slot.state is ModelState.FAILED and started_load is not None and slot.ended > started_load:
                raise slot.error or ModelUnavailableError(f"model {slot.name!r} failed to load")
            if slot.state in (ModelState.NOT_LOADED, ModelState.FAILED):
                self._refuse_never_fitting(slot)
                started_load = slot.ended
                self._start_load(slot)
            elif slot.state is ModelState.LOADING and started_load is None:
                started_load = slot.ended  # a load already under way: its failure is ours too
            await self._wait_change()

    def _lease(self, slot: ModelSlot) -> Lease:
        slot.leases += 1
        slot.last_used = trio.current_time()
        return Lease(self, slot)

    def _release(self, slot: ModelSlot) -> None:
        slot.leases -= 1
        slot.last_used = trio.current_time()
        self._notify()

    def _refuse_never_fitting(self, slot: ModelSlot) -> None:
        """A model measured too large for the budget is refused without another load."""
        if slot.footprint is not None and make_room(self._others(slot), slot.footprint, self.budget).never:
            raise self._too_large(slot, slot.footprint)

    async def unload(self, slot: ModelSlot) -> None:
        """Unload ``slot``'s model (its requests inside finish first); a no-op when it is not
        loaded. A later request loads it again."""
        if slot.state in (ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING):
            slot._unload.set()
            self._notify()
            while slot.state in (ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING):
                await self._wait_change()

    # --- loading ----------------------------------------------------------------------------

    def _start_load(self, slot: ModelSlot) -> None:
        assert self._nursery is not None, "the registry is not running"
        slot.state = ModelState.LOADING
        slot.loading_since = trio.current_time()
        slot.load_phase = "making_room"
        slot._unload = trio.Event()
        self._notify()
        self._nursery.start_soon(self._hold, slot, name=f"model {slot.name}")

    async def _hold(self, slot: ModelSlot) -> None:
        """Load the model, keep it until asked to unload (or its engine fails), then close it."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                engine = await self._load(slot, stack)
                await self._serve_until_unloaded(slot, engine)
            slot.state, slot.error = ModelState.NOT_LOADED, None
            logger.info("unloaded model %s", logfmt_value(slot.name))
        except Exception as exc:  # boundary: any load failure is this model's alone
            slot.state, slot.error = ModelState.FAILED, _unavailable(slot, exc)
            logger.error("model %s failed: %s", logfmt_value(slot.name), slot.error)
        finally:
            slot.engine = slot.serving = None
            slot.loading_since = slot.load_phase = None
            slot.reserved = 0
            slot.ended += 1
            self._notify()

    async def _load(self, slot: ModelSlot, stack: contextlib.AsyncExitStack) -> Engine:
        """Make room (its last footprint, or the estimate, reserved while it loads), open the
        engine, measure it and make the rest of its room. The loads may overlap: each takes its
        room with no checkpoint between the decision and the reservation."""
        cfg = slot.entry.config
        need = slot.footprint if slot.footprint is not None else self._estimate(cfg)
        await self._make_room(slot, need)
        slot.reserved = need  # no checkpoint since the room was found: no other load took it
        slot.load_phase = "loading"
        self._notify()
        logger.info("loading model %s path=%s", logfmt_value(slot.name), logfmt_value(cfg.model.path))
        engine = await stack.enter_async_context(self._opener(cfg))
        slot.load_phase = "measuring"
        slot.footprint = self._measure(engine)
        await self._make_room(slot, slot.footprint)
        slot.reserved = 0
        slot.engine, slot.serving = engine, self._serving(engine, slot.entry)
        slot.state = ModelState.LOADED
        elapsed = trio.current_time() - (slot.loading_since or trio.current_time())
        slot.loading_since = slot.load_phase = None
        logger.info("loaded model %s in %.1f s memory_mb=%d", logfmt_value(slot.name), elapsed, slot.footprint // MIB)
        self._notify()
        return engine

    async def _serve_until_unloaded(self, slot: ModelSlot, engine: Engine) -> None:
        async with trio.open_nursery() as nursery:

            async def on_failure() -> None:
                await engine.wait_failed()
                slot._unload.set()

            nursery.start_soon(on_failure)
            await slot._unload.wait()
            slot.state = ModelState.UNLOADING
            self._notify()
            nursery.cancel_scope.cancel()
        engine.start_draining()  # leaving open_engine waits for the requests inside

    async def _make_room(self, slot: ModelSlot, need: int) -> None:
        """Unload idle models, least recently used first, until ``need`` bytes fit; wait while
        only busy ones could make room. A model that can never fit is refused."""
        waited = False
        while True:
            room = make_room(self._others(slot), need, self.budget)
            if room.never:
                raise self._too_large(slot, need)
            if room.fits and not room.unload:
                return
            slot.load_phase = "making_room"
            if not room.fits and not waited:
                waited = True
                logger.info(
                    "model %s waits for busy models to become idle: it needs %d MiB",
                    logfmt_value(slot.name),
                    need // MIB,
                )
            for name in room.unload:
                victim = self._by_name[name]
                if victim._unload.is_set():
                    continue  # already leaving
                logger.info("unloading idle model %s to make room for %s", logfmt_value(name), logfmt_value(slot.name))
                victim._unload.set()
            await self._wait_change()

    def _others(self, slot: ModelSlot | None) -> tuple[Resident, ...]:
        """The other models that hold memory now (loading, loaded, or unloading)."""
        holding = (ModelState.LOADING, ModelState.LOADED, ModelState.UNLOADING)
        return tuple(s.resident() for s in self.slots if s is not slot and s.state in holding)

    def _too_large(self, slot: ModelSlot, need: int) -> ModelUnavailableError:
        pinned = sum(r.footprint for r in self._others(slot) if r.pinned)
        return ModelUnavailableError(
            f"model {slot.name!r} needs {need // MIB} MiB (weights plus KV) and can never fit: "
            f"the models' memory budget is {self.budget // MIB} MiB, {pinned // MIB} MiB of it pinned "
            "(server.model_memory_mb / model_memory_percent)."
        )

    async def _wait_settled(self, slot: ModelSlot) -> None:
        while slot.state is ModelState.LOADING:
            await self._wait_change()

    # --- change notification ----------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()


def _unavailable(slot: ModelSlot, exc: Exception) -> ModelUnavailableError:
    """A load failure as the error its requests get: the first of our errors inside."""
    if isinstance(exc, ModelUnavailableError):
        return exc
    cause = _our_error(exc)
    return ModelUnavailableError(f"model {slot.name!r} could not be loaded: {cause or f'{type(exc).__name__}: {exc}'}")


def _our_error(exc: BaseException) -> VllmMlxTrioError | None:
    if isinstance(exc, VllmMlxTrioError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := _our_error(inner)) is not None:
                return found
    return None


@contextlib.asynccontextmanager
async def leased(registry: ModelRegistry, slot: ModelSlot) -> AsyncIterator[Lease]:
    """:meth:`ModelRegistry.acquire` as a context manager."""
    lease = await registry.acquire(slot)
    try:
        yield lease
    finally:
        lease.release()
