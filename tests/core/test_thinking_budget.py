"""The thinking budget's tracker: which token a row must take next."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from vllm_mlx_trio.core.thinking_budget import ThinkingBudget, ThinkingBudgetTracker

START, END = (90, 91), (92, 93, 94)


def spec(budget=3, *, inside=False):
    return ThinkingBudget(budget=budget, start_ids=START, end_ids=END, starts_inside=inside)


def run(tracker: ThinkingBudgetTracker, proposals: list[int]) -> list[int]:
    """Generate: each step takes the forced token if any, else the next proposal."""
    out = []
    for token in proposals:
        forced = tracker.forced()
        token = token if forced is None else forced
        tracker.feed(token)
        out.append(token)
    return out


def test_budget_spent_inside_an_opened_block_forces_the_end_marker():
    tracker = ThinkingBudgetTracker(spec(3, inside=True))
    assert run(tracker, [1, 2, 3, 4, 5, 6, 7, 8]) == [1, 2, 3, *END, 7, 8]
    assert not tracker.inside


def test_the_model_closing_the_block_itself_is_not_forced():
    tracker = ThinkingBudgetTracker(spec(5, inside=True))
    assert run(tracker, [1, *END, 4, 5, 6, 7, 8]) == [1, *END, 4, 5, 6, 7, 8]


def test_a_block_the_model_opens_is_counted_from_its_start():
    tracker = ThinkingBudgetTracker(spec(2))
    assert run(tracker, [1, 2, 3, *START, 5, 6, 7, 8, 9, 10]) == [1, 2, 3, *START, 5, 6, *END, 10]


def test_an_end_marker_already_begun_is_completed_not_restarted():
    tracker = ThinkingBudgetTracker(spec(2, inside=True))
    assert run(tracker, [1, END[0], 7, 7, 7]) == [1, END[0], *END[1:], 7]


def test_replayed_tokens_of_a_preempted_row_restore_the_state():
    tracker = ThinkingBudgetTracker(spec(3, inside=True), generated=[1, 2, 3, END[0]])
    assert tracker.forced() == END[1]


@given(st.lists(st.integers(0, 8), max_size=60), st.integers(1, 10), st.booleans())
def test_no_block_is_ever_longer_than_the_budget_and_its_end_marker(proposals, budget, inside):
    tracker = ThinkingBudgetTracker(spec(budget, inside=inside))
    longest = 0
    for token in proposals:
        run(tracker, [token])
        if tracker.inside or tracker.count:
            longest = max(longest, tracker.count)
    assert longest <= budget + len(END)
