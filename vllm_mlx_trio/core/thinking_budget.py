"""A reasoning-token budget (Anthropic's ``thinking.budget_tokens``, vLLM's thinking budget):
once a request has generated ``budget`` tokens inside its thinking block, the block's end
marker is forced, token by token, and the reply goes on after it. Pure: the MLX thread's
logits processor (worker/sampling.py) asks :meth:`ThinkingBudgetTracker.forced` each step.

The markers are token-id sequences (``<think>`` may be one special token or several plain
ones). The block is entered when the template opened it (``starts_inside``) or when the
model writes the start marker; it is left when the end marker's last token is generated.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs


@attrs.frozen(slots=True, kw_only=True)
class ThinkingBudget:
    """At most ``budget`` tokens inside the thinking block delimited by these markers."""

    budget: int
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    #: The prompt ends inside the block (the template opened it): set by admission.
    starts_inside: bool = False


class ThinkingBudgetTracker:
    """Follows one row's generated tokens; :meth:`forced` is the token the row must take next."""

    def __init__(self, spec: ThinkingBudget, generated: Iterable[int] = ()):
        self._spec = spec
        self._inside = spec.starts_inside
        self._count = 0
        self._window = max(len(spec.start_ids), len(spec.end_ids))
        self._recent: list[int] = []
        for token in generated:
            self.feed(token)

    @property
    def inside(self) -> bool:
        return self._inside

    @property
    def count(self) -> int:
        """Tokens generated inside the current thinking block (end-marker tokens included)."""
        return self._count

    def feed(self, token: int) -> None:
        """The row generated ``token``."""
        self._recent.append(token)
        del self._recent[: -self._window]
        if self._inside:
            self._count += 1
            if self._ends_with(self._spec.end_ids):
                self._inside = False
        elif self._ends_with(self._spec.start_ids):
            self._inside, self._count = True, 0

    def forced(self) -> int | None:
        """The end marker's next token once the budget is spent inside the block, else None."""
        if not self._inside or self._count < self._spec.budget:
            return None
        end = self._spec.end_ids
        written = next((k for k in range(len(end) - 1, 0, -1) if self._ends_with(end[:k])), 0)
        return end[written]

    def _ends_with(self, ids: tuple[int, ...]) -> bool:
        return bool(ids) and tuple(self._recent[-len(ids) :]) == ids
