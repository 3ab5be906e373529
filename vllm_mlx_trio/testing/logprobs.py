"""Logprobs compared across batch shapes: the same tokens and top ids, values to a BLAS's last bits.

A float32 row's logits come from matrix products whose BLAS may pick its kernels by the number
of rows (MKL does on an AMD EPYC in every ``MKL_CBWR`` mode, strict included), so the same
request's logprobs in a batch of four and alone can differ in the last bits. A comparison of
the engine's paths (run-ahead against one step a plan, a joined row against mlx-lm's prompt
path) then asserts what the engine decides: which tokens, which top ids in which order, and
values equal to well within what any wrong row, position or temperature would move them.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.plan import TokenLogprob

#: How far a float32 logprob may move with the batch's shape: MKL's kernels move the demo
#: models' logprobs by about 2e-6; a logprob of another position or row differs by far more.
BATCH_SHAPE_TOLERANCE = 1e-4


def _close(a: float, b: float, tolerance: float) -> bool:
    return abs(a - b) <= tolerance


def logprob_mismatches(
    actual: Sequence[TokenLogprob], expected: Sequence[TokenLogprob], tolerance: float = BATCH_SHAPE_TOLERANCE
) -> list[str]:
    """Where ``actual`` differs from ``expected`` (empty: they match): a differing length, token
    id or top-id order, or a value more than ``tolerance`` away."""
    if len(actual) != len(expected):
        return [f"{len(actual)} logprobs against {len(expected)}"]
    problems = []
    for position, (got, want) in enumerate(zip(actual, expected, strict=True)):
        if got.token_id != want.token_id or [i for i, _ in got.top] != [i for i, _ in want.top]:
            problems.append(f"position {position}: {got} against {want}")
        elif not _close(got.logprob, want.logprob, tolerance) or not all(
            _close(g, w, tolerance) for (_, g), (_, w) in zip(got.top, want.top, strict=True)
        ):
            problems.append(f"position {position}: values {got} against {want}")
    return problems
