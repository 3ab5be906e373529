"""The per-step rule of batched speculation: how many drafts (0 included) a round proposes, by measurement.

A round with ``k`` drafts over ``B`` rows costs ``T(B, k)`` seconds (``k`` draft forwards and one target forward of
``B x (k + 1)`` tokens, plus the round's one host-device wait) and emits, per row, ``1 + a`` tokens where ``a`` is
the number of drafts accepted. With a per-draft acceptance ``p`` (a draft is accepted with probability ``p`` when the
drafts before it were), a row emits on average ``E(k) = 1 + p + ... + p^k`` tokens, so the batch's rate is
``B * E(k) / T(B, k)``; the rule picks the ``k`` in ``0..num_draft_tokens`` that maximises it.

Both inputs are measured while serving:

* ``p`` is the maximum-likelihood estimate of a geometric acceptance over recent rounds: each row-round that
  proposed ``b`` drafts and accepted ``a`` adds ``a`` acceptances and, if ``a < b``, one rejection; both sums decay
  by :data:`ACCEPTANCE_DECAY` a round, so the estimate follows the text being generated;
* ``T(B, k)`` is the fastest of the last :data:`TIME_WINDOW` rounds run at that batch size and ``k``: load from
  other processes only ever slows a round, so the fastest recent one is the round's own cost, and the window
  follows the cost as the contexts grow. A batch size never seen starts at the
  best choice of the nearest one seen (the most drafts at first); the rule then climbs: while a neighbour
  (``k - 1``, ``k + 1``) of the best measured choice is unmeasured it tries it once. Every :data:`PROBE_EVERY`
  rounds at a batch size it tries again the neighbour measured longest ago, so a measurement taken while the
  machine was busy does not rule a choice out for good.

Speculation pays while a step is bound by reading the weights or by per-step overhead (one row: a forward of five
tokens costs about 1.6x one of one token on the demo target) and stops paying as the batch grows (eight rows: five
tokens each cost about 3.8x one token each); docs/benchmarks.md has the figures the rule meets. Pure: no clock of its
own (the runner passes the seconds it measured).
"""

from __future__ import annotations

import collections

import attrs

#: Per round, the weight the acceptance sums keep: about the last 50 rounds count.
ACCEPTANCE_DECAY = 0.98
#: The acceptance assumed before any round (a draft model meant for the target agrees most of the time).
PRIOR_ACCEPTANCE = 0.7
#: Rounds per (batch size, k) pair whose fastest is its time.
TIME_WINDOW = 8
#: Rounds at one batch size between two probes of the pair measured longest ago.
PROBE_EVERY = 32


def expected_tokens(acceptance: float, num_drafts: int) -> float:
    """Tokens a row emits per round on average: ``1 + p + ... + p^k``."""
    return sum(acceptance**j for j in range(num_drafts + 1))


@attrs.define
class _Timing:
    recent: collections.deque  # the last TIME_WINDOW rounds' seconds
    measured_at: int  # the batch size's round counter when last measured

    @property
    def seconds(self) -> float:
        return min(self.recent)


@attrs.define
class DraftRule:
    """Chooses each round's number of drafts from the running acceptance and the measured round times."""

    max_drafts: int
    _accepted: float = PRIOR_ACCEPTANCE * 4
    _rejected: float = (1 - PRIOR_ACCEPTANCE) * 4
    _timings: dict[tuple[int, int], _Timing] = attrs.field(factory=dict)
    _rounds: dict[int, int] = attrs.field(factory=dict)

    @property
    def acceptance(self) -> float:
        """The running per-draft acceptance estimate."""
        return self._accepted / (self._accepted + self._rejected)

    def choose(self, batch_size: int) -> int:
        """The number of drafts for a round of ``batch_size`` rows: the best measured choice, after trying its
        untried neighbours (the rate is single-peaked in ``k``, so the search climbs to the peak without trying
        every choice), and now and then a neighbour measured long ago."""
        if self.max_drafts <= 0:
            return 0
        measured = {k: timing for (b, k), timing in self._timings.items() if b == batch_size}
        if not measured:
            return self._start(batch_size)
        best = max(sorted(measured, reverse=True), key=lambda k: self.rate(batch_size, k))
        neighbours = [k for k in (best - 1, best + 1) if 0 <= k <= self.max_drafts]
        untried = [k for k in neighbours if k not in measured]
        if untried:
            return untried[0]
        if self._rounds.get(batch_size, 0) % PROBE_EVERY == 0:
            return min(neighbours, key=lambda k: measured[k].measured_at)
        return best

    def _start(self, batch_size: int) -> int:
        """The first choice at a batch size never seen: the best at the nearest one seen, else the most drafts."""
        seen = {b for b, _ in self._timings}
        if not seen:
            return self.max_drafts
        nearest = min(seen, key=lambda b: (abs(b - batch_size), b))
        measured = [k for b, k in self._timings if b == nearest]
        return max(sorted(measured, reverse=True), key=lambda k: self.rate(nearest, k))

    def rate(self, batch_size: int, num_drafts: int) -> float:
        """Expected tokens per second of a round with ``num_drafts`` drafts (0 when never measured)."""
        timing = self._timings.get((batch_size, num_drafts))
        if timing is None or timing.seconds <= 0:
            return 0.0
        return batch_size * expected_tokens(self.acceptance, num_drafts) / timing.seconds

    def observe(self, batch_size: int, num_drafts: int, seconds: float, rows: list[tuple[int, int]]) -> None:
        """A round ran: ``seconds`` long; ``rows``: each row's (drafts proposed, drafts accepted)."""
        rounds = self._rounds.get(batch_size, 0) + 1
        self._rounds[batch_size] = rounds
        key = (batch_size, num_drafts)
        timing = self._timings.get(key)
        if timing is None:
            self._timings[key] = _Timing(collections.deque([seconds], maxlen=TIME_WINDOW), rounds)
        else:
            timing.recent.append(seconds)
            timing.measured_at = rounds
        proposed = [(b, a) for b, a in rows if b]
        if proposed:
            self._accepted *= ACCEPTANCE_DECAY
            self._rejected *= ACCEPTANCE_DECAY
            for budget, accepted in proposed:
                self._accepted += accepted
                self._rejected += 1 if accepted < budget else 0
