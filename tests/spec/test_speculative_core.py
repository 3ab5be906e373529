"""core/speculative.py: the envelope, the draft budget and the step counts (pure)."""

from __future__ import annotations

import attrs
import pytest

from vllm_mlx_trio.core.constraint import ConstraintSpec
from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.speculative import (
    SpecDecodeCounts,
    draft_budget,
    in_envelope,
    sampling_fits,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def test_greedy_without_extras_fits_alone():
    assert sampling_fits(GREEDY, 0)
    assert in_envelope(1, GREEDY, 0)


@pytest.mark.parametrize("num_running", [0, 2, 5])
def test_not_alone_is_outside(num_running):
    assert not in_envelope(num_running, GREEDY, 0)


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.7},
        {"top_p": 0.9},
        {"top_k": 5},
        {"min_p": 0.1},
        {"logprobs": 0},
        {"logprobs": 3},
        {"repetition_penalty": 1.1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
        {"logit_bias": ((5, 3.0),)},
    ],
)
def test_each_sampling_extra_breaks_the_envelope(change):
    assert not sampling_fits(attrs.evolve(GREEDY, **change), 0)


def test_a_constraint_breaks_the_envelope():
    constrained = attrs.evolve(GREEDY, constraint=ConstraintSpec(kind="json_object", body=""))
    assert not sampling_fits(constrained, 0)


def test_min_tokens_holds_the_request_out_until_reached():
    params = attrs.evolve(GREEDY, min_tokens=3)
    assert [sampling_fits(params, n) for n in range(5)] == [False, False, False, True, True]


@pytest.mark.parametrize(("k", "left", "budget"), [(4, 100, 4), (4, 5, 4), (4, 4, 3), (4, 1, 0), (4, 0, 0)])
def test_draft_budget_never_drafts_past_max_tokens(k, left, budget):
    assert draft_budget(k, left) == budget


def test_counts_add_up_by_position():
    total = SpecDecodeCounts.of_round(4, 2) + SpecDecodeCounts.of_round(4, 4) + SpecDecodeCounts.of_round(2, 0)
    assert total == SpecDecodeCounts(
        num_drafts=3, num_draft_tokens=10, num_accepted_tokens=6, accepted_per_position=(2, 2, 1, 1)
    )
    assert total.acceptance_rate == pytest.approx(0.6)
    assert total.mean_accepted_length == pytest.approx(3.0)


def test_empty_counts_have_no_rates():
    assert SpecDecodeCounts().acceptance_rate is None
    assert SpecDecodeCounts().mean_accepted_length is None


@pytest.mark.parametrize("change", [{"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1}])
def test_unseeded_sampling_fits_when_the_drafter_samples(change):
    params = attrs.evolve(GREEDY, **change)
    assert sampling_fits(params, 0, sampled=True)
    assert in_envelope(1, params, 0, sampled=True)
    assert not sampling_fits(params, 0)  # a drafter without rejection sampling keeps it out


@pytest.mark.parametrize(
    "change",
    [
        {"temperature": 0.7, "seed": 3},  # reproducible whatever else runs: never speculated
        {"temperature": 0.7, "top_k": 1},  # greedy by another name: the normal path's argmax
        {"temperature": 0.7, "logprobs": 1},
        {"temperature": 0.7, "presence_penalty": 0.5},
    ],
)
def test_what_keeps_a_sampled_request_out(change):
    assert not sampling_fits(attrs.evolve(GREEDY, **change), 0, sampled=True)


def test_a_thinking_budget_breaks_the_envelope():
    from vllm_mlx_trio.core.thinking_budget import ThinkingBudget

    budget = ThinkingBudget(budget=16, start_ids=(5,), end_ids=(6,))
    assert not sampling_fits(attrs.evolve(GREEDY, thinking_budget=budget), 0)
