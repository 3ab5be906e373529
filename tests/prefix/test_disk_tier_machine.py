"""The two-tier state machine (tests/prefix/two_tier_machine.py) for a model whose every layer is
``kv``: a hit may end anywhere, even inside a block or a tail, and full blocks go to disk."""

from __future__ import annotations

from hypothesis import settings
from two_tier_machine import TwoTierMachine

TestTwoTierMachine = TwoTierMachine.TestCase
TestTwoTierMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None, database=None)
