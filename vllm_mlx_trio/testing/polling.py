"""The one polling loop of the test suite, for state observed from outside a running engine.

Where a test can wait on an event (or, with fakes and the autojump clock, on
``trio.testing.wait_all_tasks_blocked``) it does. A real model on its own thread, or a server
seen over HTTP while a fake executor sleeps in real time, offers no event for "the engine has
let go of the request": those tests look again every ``poll_s`` seconds, here, under their
own ``trio.fail_after`` / ``trio.move_on_after``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def wait_until(probe: Callable[[], T | Awaitable[T]], *, poll_s: float, until: Callable[[T], Any] = bool) -> T:
    """Call ``probe`` (plain or async) every ``poll_s`` seconds until ``until(value)`` holds
    (by default: until the value is true); return that value.

    It never gives up by itself: bound it with a cancel scope.
    """
    # The state is observed from outside the engine: there is no event to wait on.
    while not until(value := await _call(probe)):  # noqa: ASYNC110 polling is this helper's one job (see above)
        await trio.sleep(poll_s)
    return value


def engine_idle(stats) -> bool:
    """For ``until``: the engine's statistics show no request held, no sequence running and
    no prefix-cache lease (the release reaches the cache manager a message after the abort;
    a lease never released makes the caller's time limit fail)."""
    return not stats.num_requests and not stats.scheduler.num_running and not stats.cache.num_leased


async def _call(probe: Callable[[], T | Awaitable[T]]) -> T:
    value = probe()
    if inspect.isawaitable(value):
        return await value
    return value
