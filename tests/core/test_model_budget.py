"""The models' memory budget: which idle models leave so another fits."""

from __future__ import annotations

from vllm_mlx_trio.core.model_budget import Resident, Room, make_room


def resident(name: str, footprint: int, last_used: float, **kwargs) -> Resident:
    return Resident(name=name, footprint=footprint, last_used=last_used, **kwargs)


def test_fits_as_it_is_when_there_is_room():
    assert make_room((resident("a", 40, 1.0),), 50, 100) == Room(fits=True)


def test_the_least_recently_used_idle_ones_leave_first():
    residents = (resident("a", 40, 3.0), resident("b", 30, 1.0), resident("c", 30, 2.0))
    assert make_room(residents, 50, 100) == Room(fits=True, unload=("b", "c"))


def test_busy_and_pinned_models_never_leave():
    residents = (resident("a", 40, 1.0, busy=True), resident("b", 30, 2.0, pinned=True), resident("c", 20, 3.0))
    assert make_room(residents, 30, 100) == Room(fits=True, unload=("c",))
    assert make_room(residents, 50, 100) == Room(fits=False)  # waits for "a"


def test_a_model_larger_than_the_budget_less_the_pinned_can_never_fit():
    residents = (resident("a", 40, 1.0, pinned=True),)
    assert make_room(residents, 61, 100).never
    assert not make_room(residents, 60, 100).never
