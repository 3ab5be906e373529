"""A scheduler actor wired to channels a test holds: the test plays admission, the executor and,
when it wants, the cache manager."""

from __future__ import annotations

import attrs
import trio

from ..actors.scheduler.actor import SchedulerActor
from ..actors.scheduler.settings import SchedulerSettings
from ..core.params import SamplingParams
from ..health import EngineHealth
from ..messages import Admit, RequestId
from .fake_executor import IM_END


@attrs.define
class Wired:
    """A SchedulerActor on hand-held channels: the test plays the executor and, optionally,
    the cache manager."""

    scheduler: SchedulerActor
    health: EngineHealth
    admit_send: trio.MemorySendChannel
    control_send: trio.MemorySendChannel
    depart_send: trio.MemorySendChannel
    plan_recv: trio.MemoryReceiveChannel
    result_send: trio.MemorySendChannel
    cache_recv: trio.MemoryReceiveChannel
    match_send: trio.MemorySendChannel

    @classmethod
    def build(cls, settings: SchedulerSettings | None = None) -> Wired:
        """The scheduler with ``settings`` (default: the fake tokenizer's end token, nothing else set)."""
        health = EngineHealth()
        admit_send, admit_recv = trio.open_memory_channel(1)
        control_send, control_recv = trio.open_memory_channel(1)
        depart_send, depart_recv = trio.open_memory_channel(4)
        plan_send, plan_recv = trio.open_memory_channel(0)
        result_send, result_recv = trio.open_memory_channel(1)
        cache_send, cache_recv = trio.open_memory_channel(8)
        match_send, match_recv = trio.open_memory_channel(1)
        scheduler = SchedulerActor(
            admit_recv=admit_recv,
            control_recv=control_recv,
            depart_recv=depart_recv,
            plan_send=plan_send,
            result_recv=result_recv,
            cache_send=cache_send,
            match_recv=match_recv,
            settings=settings or SchedulerSettings(eos_token_ids=(IM_END,)),
            health=health,
        )
        return cls(
            scheduler, health, admit_send, control_send, depart_send, plan_recv, result_send, cache_recv, match_send
        )

    async def admit(self) -> trio.MemoryReceiveChannel:
        """Admit one request; its outbox."""
        outbox_send, outbox_recv = trio.open_memory_channel(4)
        await self.admit_send.send(
            Admit(
                request_id=RequestId("r"),
                prompt_token_ids=(5, 6, 7),
                params=SamplingParams(max_tokens=5),
                outbox=outbox_send,
                arrival_time=0.0,
            )
        )
        return outbox_recv
