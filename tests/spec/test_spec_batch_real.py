"""Batched speculation on the real tiny demo model (float32), driven plan by plan: several rows speculate in one
round, each accepting its own number of drafts; the reference is the plain batched runner on the same plans."""

from __future__ import annotations

import attrs
import pytest

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId

from .conftest import PlanDriver, spec_config

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
PROMPTS = (tuple(range(40, 60)), tuple(range(100, 112)), tuple(range(7, 40)), tuple(range(300, 305)))


def new(rid: str, prompt, params=GREEDY) -> NewSequence:
    return NewSequence(request_id=RequestId(rid), prompt_token_ids=tuple(prompt), params=params)


def together(runner, sequences, *, stagger: int = 0) -> PlanDriver:
    """All ``sequences`` run to the end; with ``stagger``, each joins that many steps after the one before."""
    driver = PlanDriver(runner)
    waiting = list(sequences)
    if not stagger:
        driver.step(new=waiting)
        waiting = []
    else:
        driver.step(new=[waiting.pop(0)])
    step = 0
    while driver.active or waiting:
        step += 1
        joining = [waiting.pop(0)] if waiting and step % stagger == 0 else []
        driver.step(new=joining)
    return driver


@pytest.mark.parametrize("num_rows", [2, 3, 4])
def test_several_greedy_rows_speculate_together_and_match_the_normal_path(runners, num_rows):
    plain, spec = runners
    sequences = [new(f"r{i}", PROMPTS[i], attrs.evolve(GREEDY, max_tokens=20 + 3 * i)) for i in range(num_rows)]
    reference = together(plain, sequences).outputs
    driver = together(spec, sequences)
    assert dict(driver.outputs) == dict(reference)
    # several rows in one round: some step gave several rows several tokens each
    assert any(sum(len(tokens) > 1 for _, tokens in r.sampled) >= 2 for r in driver.results)


def test_rows_joining_and_leaving_at_different_times_match(runners):
    plain, spec = runners
    sequences = [new(f"r{i}", PROMPTS[i], attrs.evolve(GREEDY, max_tokens=12 + 5 * i)) for i in range(4)]
    reference = together(plain, sequences, stagger=3).outputs
    assert dict(together(spec, sequences, stagger=3).outputs) == dict(reference)


class CorruptingDrafts:
    """Wraps a DraftBatch: each draft is replaced by another token with probability ``rate`` (seeded), so rows
    accept different numbers of drafts in the same round."""

    def __init__(self, inner, rate: float, seed: int = 0):
        import numpy as np

        self._inner, self._rate, self._rng = inner, rate, np.random.default_rng(seed)
        self.ragged_rounds = 0

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __len__(self):
        return len(self._inner)

    def propose(self, tails, pending, num_tokens, picks):
        import mlx.core as mx

        drafts = self._inner.propose(tails, pending, num_tokens, picks)
        flip = mx.array(self._rng.random(drafts.shape) < self._rate)
        return mx.where(flip, (drafts + 1) % 1000, drafts).astype(mx.uint32)

    def settle(self, num_accepted, num_drafts, inputs, hidden=None):
        self.ragged_rounds += len(set(num_accepted)) > 1
        self._inner.settle(num_accepted, num_drafts, inputs, hidden)


def checked_rows(runner):
    """Each speculating row's target cache holds exactly its tokens (no phantom keys counted)."""
    from vllm_mlx_trio.worker.speculative.ragged import row_lengths

    batch = runner._spec_batch
    if batch.rows:
        assert row_lengths(batch._cache) == [len(row.tokens) for row in batch.rows]


@pytest.mark.parametrize("num_rows", [2, 4])
def test_rows_accepting_different_counts_match_the_normal_path(runners, num_rows):
    plain, spec = runners
    spec._spec_batch._draft = wrapper = CorruptingDrafts(spec._spec_batch._draft, rate=0.25, seed=num_rows)
    sequences = [new(f"r{i}", PROMPTS[i], attrs.evolve(GREEDY, max_tokens=24 + 2 * i)) for i in range(num_rows)]
    reference = together(plain, sequences).outputs
    driver = PlanDriver(spec)
    driver.step(new=sequences)
    while driver.active:
        driver.step()
        checked_rows(spec)
    assert dict(driver.outputs) == dict(reference)
    assert wrapper.ragged_rounds > 0
    counts = [r.spec_decode for r in driver.results if r.spec_decode is not None]
    assert 0 < sum(c.num_accepted_tokens for c in counts) < sum(c.num_draft_tokens for c in counts)


def test_sampled_rows_speculate_beside_greedy_rows(runners):
    """Unseeded sampled rows speculate in the same rounds as greedy rows (rejection sampling, one sampler each); at a
    tiny temperature their tokens are the greedy ones, which holds only if every row's verdict reads its own logits."""
    plain, spec = runners
    nearly_greedy = attrs.evolve(GREEDY, temperature=1e-4)
    sequences = [new(f"r{i}", PROMPTS[i], GREEDY if i % 2 else nearly_greedy) for i in range(4)]
    reference = together(plain, [new(f"r{i}", PROMPTS[i]) for i in range(4)]).outputs
    driver = together(spec, sequences)
    assert dict(driver.outputs) == dict(reference)
    assert driver.num_drafts > 0


def test_a_seeded_row_on_the_normal_path_shares_the_step_with_speculating_rows(runners):
    """A seeded sampled row and a row asking for logprobs may not speculate: they decode in the generator in the same
    steps as the speculating rows, with the tokens (and logprobs) they get with speculation off."""
    plain, spec = runners
    seeded = SamplingParams(temperature=0.9, seed=7, max_tokens=26, ignore_eos=True)
    sequences = [
        new("g0", PROMPTS[0]),
        new("seeded", PROMPTS[1], seeded),
        new("g1", PROMPTS[2]),
        new("logprobs", PROMPTS[3], attrs.evolve(GREEDY, logprobs=1)),
    ]
    reference = together(plain, sequences)
    driver = together(spec, sequences)
    assert dict(driver.outputs) == dict(reference.outputs)
    shared = [r for r in driver.results if {rid for rid, _ in r.sampled} >= {"g0", "seeded"}]
    assert any(len(dict(r.sampled)["g0"]) > 1 for r in shared)  # g0 speculated in a step where seeded decoded

    def logprobs(d):
        return [
            (e.token_id, round(e.logprob, 4))
            for r in d.results
            for rid, es in r.logprobs
            if rid == "logprobs"
            for e in es
        ]

    assert logprobs(driver) == logprobs(reference) and logprobs(driver)


def test_a_preempted_row_resumes_in_the_batch_with_the_same_tokens(runners):
    plain, spec = runners
    sequences = [new(f"r{i}", PROMPTS[i]) for i in range(3)]
    reference = together(plain, sequences).outputs
    driver = PlanDriver(spec)
    driver.step(new=sequences)
    while len(driver.outputs["r1"]) < 9:
        driver.step()
    assert len(spec._spec_batch) == 3
    so_far = tuple(driver.outputs["r1"])
    driver.step(finished=["r1"])  # the scheduler drops it to make room ...
    assert len(spec._spec_batch) == 2
    driver.outputs["r1"] = list(so_far)
    prompt = (*PROMPTS[1], *so_far)
    resumed = NewSequence(
        request_id=RequestId("r1"), prompt_token_ids=prompt, params=GREEDY, num_output_tokens=len(so_far)
    )
    driver.step(new=[resumed])  # ... and recomputes it from prompt + output later
    driver.run_until_done()
    assert dict(driver.outputs) == dict(reference)


def test_a_runner_of_another_kind_built_on_this_one_keeps_the_one_row_path(float32_dir):
    """A runner of another kind composed with the speculative one (the vlm runner's) keeps its own one-row envelope."""
    from vllm_mlx_trio.worker.speculative.runner import SpecRunner

    class OtherKind(SpecRunner):
        kind = "vlm-speculative"

    runner = OtherKind(spec_config(float32_dir, float32_dir))
    runner.load()
    try:
        assert runner._spec_batch is None
    finally:
        runner.close()
