"""Shared pieces of the speculative tests: demo models, drafters that block or disagree, a plan driver."""

from __future__ import annotations

import random
import threading
from collections import defaultdict
from collections.abc import Sequence

import pytest

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan


@pytest.fixture(scope="session")
def spec_pair(tmp_path_factory) -> tuple[str, str]:
    """``spec-target`` and ``spec-draft`` (the agreeing demo pair), built once."""
    from vllm_mlx_trio.worker.demo import build_demo_model  # imports mlx

    root = tmp_path_factory.mktemp("spec")
    target = build_demo_model(root / "target", size="spec-target")
    draft = build_demo_model(root / "draft", size="spec-draft")
    return str(target), str(draft)


def spec_config(model: str, draft: str | None, *overrides: str, method: str = "draft"):
    """A config for ``model``; with ``draft``, speculation on with it (``method = off`` otherwise)."""
    spec = [f"speculative.method={method}", f"speculative.draft_model={draft}"] if draft else []
    # One decode step per plan (no run-ahead): the tests count tokens per step.
    steps = ["engine.run_ahead_steps=1"]
    return load_config(None, overrides=[f"model.path={model}", *spec, *steps, *overrides], environ={})


def build(cfg, **kwargs):
    """The runner ``cfg`` asks for, loaded; the caller closes it."""
    from vllm_mlx_trio.worker.registry import runner_for

    runner = runner_for(cfg)(cfg, **kwargs)
    runner.load()
    return runner


@pytest.fixture
def runners(float32_dir):
    """(plain batched runner, speculative runner drafting with the target itself); closed after the test."""
    made = [build(spec_config(float32_dir, None)), build(spec_config(float32_dir, float32_dir))]
    yield made
    for runner in made:
        runner.close()


class RandomDrafter:
    """A drafter that disagrees: uniformly random drafts (seeded), no state."""

    needs_target_hidden = False

    def __init__(self, vocab_size: int, seed: int = 0):
        self._rng = random.Random(seed)
        self._vocab_size = vocab_size
        self.calls: list[str] = []

    def start(self, tokens, target_hidden) -> None:
        self.calls.append("start")

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        self.calls.append("propose")
        return [self._rng.randrange(self._vocab_size) for _ in range(num_tokens)]

    def settle(self, accepted, target_hidden) -> None:
        self.calls.append("settle")

    def stop(self) -> None:
        self.calls.append("stop")


class BlockingDrafter:
    """Wraps a drafter; its ``block_at``-th propose (from 0) waits for ``release`` after setting ``blocked``."""

    def __init__(self, inner, block_at: int):
        self.needs_target_hidden = inner.needs_target_hidden
        self._inner = inner
        self._block_at = block_at
        self._num_proposed = 0
        self.blocked = threading.Event()
        self.release = threading.Event()
        self.stopped = threading.Event()

    def start(self, tokens, target_hidden) -> None:
        self._inner.start(tokens, target_hidden)

    def propose(self, last_token: int, num_tokens: int) -> list[int]:
        if self._num_proposed == self._block_at:
            self.blocked.set()
            self.release.wait(60)
        self._num_proposed += 1
        return self._inner.propose(last_token, num_tokens)

    def settle(self, accepted, target_hidden) -> None:
        self._inner.settle(accepted, target_hidden)

    def stop(self) -> None:
        self._inner.stop()
        self.stopped.set()


class OneRowDrafter:
    """Wraps the draft model's drafter without its ``batch``: the runner keeps the one-row path (as for MTP)."""

    needs_target_hidden = False

    def __init__(self, inner):
        self._inner = inner

    def start(self, tokens, target_hidden) -> None:
        self._inner.start(tokens, target_hidden)

    def propose(self, last_token, num_tokens):
        return self._inner.propose(last_token, num_tokens)

    def propose_lazy(self, last_token, num_tokens, pick=None):
        return self._inner.propose_lazy(last_token, num_tokens, pick)

    def draft_ahead(self, drafts, bonus, num_tokens, pick=None) -> None:
        self._inner.draft_ahead(drafts, bonus, num_tokens, pick)

    def settle(self, accepted, target_hidden) -> None:
        self._inner.settle(accepted, target_hidden)

    def stop(self) -> None:
        self._inner.stop()


class PlanDriver:
    """Drives a runner with hand-made plans, as the scheduler would: every live sequence decodes each step."""

    def __init__(self, runner):
        self.runner = runner
        self.outputs: dict[str, list[int]] = defaultdict(list)
        self.active: list[str] = []
        self.results = []
        self._step_id = 0

    def step(self, new: Sequence[NewSequence] = (), finished: Sequence[str] = ()) -> None:
        decode = tuple(RequestId(rid) for rid in self.active if rid not in finished)
        plan = StepPlan(
            step_id=self._step_id,
            new_seqs=tuple(new),
            decode_ids=decode,
            finished_ids=tuple(RequestId(r) for r in finished),
        )
        self._step_id += 1
        result = self.runner.execute(plan)
        self.results.append(result)
        assert not result.failed, result.failed
        for rid, tokens in result.sampled:
            self.outputs[rid].extend(tokens)
        self.active = [rid for rid in (*decode, *(s.request_id for s in new)) if rid in self.runner._live]

    def run_until_done(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.active:
                return
            self.step()
        raise AssertionError("did not finish")

    @property
    def num_drafts(self) -> int:
        return sum(r.spec_decode.num_drafts for r in self.results if r.spec_decode is not None)
