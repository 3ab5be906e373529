"""core/spec_rule.py: the per-step choice of the number of drafts from measured round times and acceptance."""

from __future__ import annotations

import pytest

from vllm_mlx_trio.core.spec_rule import PROBE_EVERY, DraftRule, expected_tokens


def round_time(batch: int, k: int, *, fixed: float, per_token: float, draft: float = 0.0) -> float:
    """A round's seconds on a machine whose forward costs ``fixed + per_token * tokens``."""
    return fixed + per_token * batch * (k + 1) + k * draft


def settle(rule: DraftRule, batch: int, rounds: int, accepted: int | None = None, **cost) -> list[int]:
    """Run ``rounds`` rounds with the given cost; each row accepts ``accepted`` drafts (all, by default)."""
    chosen = []
    for _ in range(rounds):
        k = rule.choose(batch)
        chosen.append(k)
        a = k if accepted is None else min(k, accepted)
        rule.observe(batch, k, round_time(batch, k, **cost), [(k, a)] * batch)
    return chosen


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_an_overhead_bound_step_drafts_the_most():
    rule = DraftRule(4)
    chosen = settle(rule, 1, 40, fixed=0.025, per_token=0.003)
    assert chosen[0] == 4 and chosen[-5:] == [4] * 5


def test_a_compute_bound_batch_drafts_less_or_none():
    rule = DraftRule(4)
    chosen = settle(rule, 8, 60, accepted=0, fixed=0.025, per_token=0.004, draft=0.005)  # nothing is ever accepted
    assert chosen[-5:] == [0] * 5
    assert rule.acceptance < 0.2


def test_the_choice_depends_on_the_batch_size():
    rule = DraftRule(4)
    cost = dict(fixed=0.024, per_token=0.0045, draft=0.004)
    settle(rule, 1, 60, accepted=2, **cost)
    settle(rule, 8, 60, accepted=2, **cost)
    assert rule.choose(1) > rule.choose(8)


def test_a_new_batch_size_starts_from_the_nearest_one_seen():
    rule = DraftRule(4)
    settle(rule, 4, 60, accepted=0, fixed=0.02, per_token=0.004)
    assert rule.choose(5) == rule.choose(4) == 0


def test_a_slow_measurement_is_probed_again():
    """A choice measured once while the machine was busy is tried again later, and wins once it is fast."""
    rule = DraftRule(2)
    rule.observe(1, 2, 10.0, [(2, 2)])  # a busy moment: the best choice looks terrible
    chosen = settle(rule, 1, 4 * PROBE_EVERY, fixed=0.025, per_token=0.003)
    assert chosen[-12:].count(2) >= 10  # a probe of a neighbour now and then
