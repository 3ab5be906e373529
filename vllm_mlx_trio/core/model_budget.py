"""The memory budget of several loaded models: which idle ones to unload so another fits.

Pure arithmetic over snapshots; the model registry (models/registry.py) acts on the answer.
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen(kw_only=True)
class Resident:
    """A loaded model as the budget sees it."""

    name: str
    #: Weights plus KV (running sequences' budget and prefix cache), bytes.
    footprint: int
    #: When it last served a request (any monotonic clock); the least recent leaves first.
    last_used: float = -math.inf
    #: Requests inside it, or waiting for it: it cannot leave now.
    busy: bool = False
    pinned: bool = False


@attrs.frozen(kw_only=True)
class Room:
    """The budget's answer for one model that wants in."""

    #: It fits beside the models that stay: load it.
    fits: bool
    #: Idle models to unload first (least recently used first); empty when it fits as it is.
    unload: tuple[str, ...] = ()
    #: It can never fit: larger than the budget less the pinned models'.
    never: bool = False


def make_room(residents: tuple[Resident, ...], need: int, budget: int) -> Room:
    """Which residents to unload so ``need`` more bytes fit in ``budget``.

    ``fits`` with the least recently used idle, unpinned residents in ``unload``; not ``fits``
    (and no ``unload``) when even unloading every idle one leaves too little: the caller waits
    for a busy one to become idle. ``never`` when the pinned residents alone leave too little.
    """
    pinned = sum(r.footprint for r in residents if r.pinned)
    if need > budget - pinned:
        return Room(fits=False, never=True)
    free = budget - sum(r.footprint for r in residents)
    if need <= free:
        return Room(fits=True)
    chosen: list[str] = []
    for resident in sorted(residents, key=lambda r: r.last_used):
        if resident.pinned or resident.busy:
            continue
        chosen.append(resident.name)
        free += resident.footprint
        if need <= free:
            return Room(fits=True, unload=tuple(chosen))
    return Room(fits=False)
