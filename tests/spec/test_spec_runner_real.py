"""The speculative runner on the real tiny demo model (float32), driven plan by plan like the scheduler drives it.

The draft model is the target itself (the same weights): it agrees on every token, so every round accepts its
drafts and the runs are as long as they get; a disagreeing drafter is tested too. The reference is the plain
batched runner on the same plans: speculation must not change a single token.
"""

from __future__ import annotations

import attrs
import pytest

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.core.spec_rule import DraftRule
from vllm_mlx_trio.messages import NewSequence, RequestId

from .conftest import OneRowDrafter, PlanDriver, RandomDrafter, build, spec_config

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPT_A = tuple(range(40, 60))
PROMPT_B = tuple(range(100, 112))


def new(rid: str, prompt=PROMPT_A, params=GREEDY, *, output: tuple[int, ...] = ()) -> NewSequence:
    return NewSequence(
        request_id=RequestId(rid), prompt_token_ids=(*prompt, *output), params=params, num_output_tokens=len(output)
    )


@pytest.fixture
def one_row(float32_dir):
    """The speculative runner on its one-row path (a drafter that drafts for one row only, as MTP's)."""
    from mlx_lm import load

    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    runner = build(
        spec_config(float32_dir, float32_dir), drafter=OneRowDrafter(DraftModelDrafter(load(float32_dir)[0]))
    )
    assert runner._spec_batch is None
    yield runner
    runner.close()


def alone(runner, params=GREEDY, prompt=PROMPT_A) -> tuple[list[int], PlanDriver]:
    driver = PlanDriver(runner)
    driver.step(new=[new("a", prompt, params)])
    driver.run_until_done()
    return driver.outputs["a"], driver


def first_new_draft_position(reference: list[int]) -> int:
    """An output position holding a draft (every round emits pending + 4 drafts: positions 5r .. 5r + 4) whose
    token did not occur before it, so a stop there ends the request there."""
    return next(i for i in range(6, len(reference)) if i % 5 and reference[i] not in reference[:i])


def test_the_runner_kind_is_chosen_by_the_method(runners):
    plain, spec = runners
    assert type(plain).__name__ == "BatchRunner"
    assert type(spec).__name__ == "SpecRunner" and type(spec).shape(spec._cfg).max_tokens_per_step == 5  # k + 1
    assert spec._kv_headroom == (2 + 1) * 5  # the plans in flight and the next, each a whole round


@pytest.mark.parametrize("max_tokens", [40, 7, 1, 2])
def test_greedy_output_is_identical_and_max_tokens_cuts_inside_a_run(runners, max_tokens):
    plain, spec = runners
    params = attrs.evolve(GREEDY, max_tokens=max_tokens)
    reference, _ = alone(plain, params)
    output, driver = alone(spec, params)
    assert output == reference and len(output) == max_tokens
    if max_tokens > 2:
        assert driver.num_drafts > 0
        # an agreeing drafter: a step gives up to num_draft_tokens + 1 tokens
        assert max(len(tokens) for r in driver.results for _, tokens in r.sampled) == 5


def test_a_stop_token_inside_an_accepted_run_ends_it_there(runners):
    plain, spec = runners
    reference, _ = alone(plain)
    stop_at = first_new_draft_position(reference)
    params = attrs.evolve(GREEDY, ignore_eos=False, stop_token_ids=(reference[stop_at],))
    expected, _ = alone(plain, params)
    output, driver = alone(spec, params)
    assert output == expected == reference[: stop_at + 1]
    assert driver.num_drafts > 0


def test_eos_inside_a_draft_ends_the_request_there(runners):
    plain, spec = runners
    reference, _ = alone(plain)
    stop_at = first_new_draft_position(reference)
    for runner in runners:  # that token is the model's EOS now (ModelInfo is what the termination rule reads)
        runner._info = attrs.evolve(runner._info, eos_token_ids=(reference[stop_at],))
    params = attrs.evolve(GREEDY, ignore_eos=False)
    expected, _ = alone(plain, params)
    output, driver = alone(spec, params)
    assert output == expected == reference[: stop_at + 1]
    assert driver.num_drafts > 0


def test_logprobs_and_sampling_run_the_normal_path(runners):
    plain, spec = runners
    for params in (
        attrs.evolve(GREEDY, logprobs=2),
        SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True),
        attrs.evolve(GREEDY, repetition_penalty=1.2),
    ):
        reference, _ = alone(plain, params)
        output, driver = alone(spec, params)
        assert output == reference
        assert driver.num_drafts == 0


def test_a_second_request_sends_the_first_back_to_the_batch_and_it_returns(runners, one_row):
    plain, spec = runners[0], one_row
    ref_a, _ = alone(plain)
    ref_b, _ = alone(plain, attrs.evolve(GREEDY, max_tokens=6), PROMPT_B)
    driver = PlanDriver(spec)
    driver.step(new=[new("a")])
    while len(driver.outputs["a"]) < 10:
        driver.step()
    assert spec._speculating is not None and spec._speculating.request_id == "a"
    drafts_before = driver.num_drafts
    driver.step(new=[new("b", PROMPT_B, attrs.evolve(GREEDY, max_tokens=6))])
    assert spec._speculating is None  # back on the batched path while b runs
    while "b" in driver.active:
        driver.step()
        assert spec._speculating is None or "b" not in driver.active
    during = driver.num_drafts
    driver.run_until_done()
    assert driver.outputs["a"] == ref_a
    assert driver.outputs["b"] == ref_b
    assert drafts_before > 0 and driver.num_drafts > during  # speculating again once alone


def test_a_preempted_request_resumes_with_the_same_tokens(runners, one_row):
    plain, spec = runners[0], one_row
    reference, _ = alone(plain)
    driver = PlanDriver(spec)
    driver.step(new=[new("a")])
    while len(driver.outputs["a"]) < 12:
        driver.step()
    assert spec._speculating is not None
    so_far = tuple(driver.outputs["a"])
    driver.step(finished=["a"])  # the scheduler drops it to make room ...
    assert spec._speculating is None and spec.num_sequences == 0
    driver.outputs["a"] = list(so_far)
    driver.step(new=[new("a", output=so_far)])  # ... and recomputes it from prompt + output later
    driver.run_until_done()
    assert driver.outputs["a"] == reference


def test_a_drafter_that_disagrees_changes_nothing(float32_dir, runners):
    plain, _ = runners
    reference, _ = alone(plain)
    drafter = RandomDrafter(vocab_size=512, seed=3)
    spec = build(spec_config(float32_dir, float32_dir), drafter=drafter)
    try:
        output, driver = alone(spec)
    finally:
        spec.close()
    assert output == reference
    counts = [r.spec_decode for r in driver.results if r.spec_decode is not None]
    total_proposed = sum(c.num_draft_tokens for c in counts)
    assert total_proposed > 0 and sum(c.num_accepted_tokens for c in counts) < total_proposed // 4
    assert drafter.calls[0] == "start" and drafter.calls[-1] == "stop"


def test_a_lone_row_that_can_speculate_does_not_run_ahead_plainly(float32_dir, runners, monkeypatch):
    """Run-ahead on (a lone row may run 16 plain steps a plan, engine.solo_run_ahead_steps): once the row
    decodes, its plans are draft rounds of at most num_draft_tokens + 1 tokens, from the first. The per-round
    rule drafts the most every round here: its own choice follows measured times (tests/spec/test_spec_rule.py),
    and a model drafting for itself may not pay on this BLAS."""
    monkeypatch.setattr(DraftRule, "choose", lambda rule, batch_size: rule.max_drafts)
    plain, _ = runners
    reference, _ = alone(plain)
    spec = build(spec_config(float32_dir, float32_dir, "engine.run_ahead_steps=8", "engine.solo_run_ahead_ms=60000"))
    try:
        output, driver = alone(spec)
    finally:
        spec.close()
    assert output == reference
    assert max(len(tokens) for r in driver.results for _, tokens in r.sampled) == 5
    assert driver.num_drafts >= (len(reference) - 2) // 5


def test_prompt_blocks_still_reach_the_prefix_cache(float32_dir):
    spec = build(spec_config(float32_dir, float32_dir, "cache.block_size=8"))
    try:
        output, driver = alone(spec)
    finally:
        spec.close()
    ready = [ready for r in driver.results for ready in r.kv_ready]
    assert driver.num_drafts > 0
    assert ready[0].token_ids[:16] == PROMPT_A[:16] and ready[0].block_nbytes  # the prompt's full blocks
    finished = ready[-1]  # store_generated: prompt + output, from the speculative path's own cache
    assert finished.token_ids == (*PROMPT_A, *output)
    assert finished.first_block == len(PROMPT_A) // 8 and len(finished.block_nbytes) == (20 + 40) // 8 - 2


SAMPLED = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=40, ignore_eos=True)


def test_an_unseeded_sampled_request_speculates_through_rejection_sampling(runners):
    """The draft model is the target: q equals p up to rounding, so almost every draft stands."""
    _, spec = runners
    output, driver = alone(spec, SAMPLED)
    assert len(output) == 40
    counts = [r.spec_decode for r in driver.results if r.spec_decode is not None]
    proposed, accepted = sum(c.num_draft_tokens for c in counts), sum(c.num_accepted_tokens for c in counts)
    assert proposed > 0 and accepted >= 0.8 * proposed


def test_a_nearly_greedy_sampled_request_gives_the_greedy_tokens(runners):
    """At a tiny temperature the target's distribution is (numerically) its argmax: p, q, the verdict and the
    residual draw are wired to the right positions only if the output is the greedy output."""
    plain, spec = runners
    reference, _ = alone(plain)
    output, driver = alone(spec, attrs.evolve(GREEDY, temperature=1e-4))
    assert driver.num_drafts > 0
    assert output == reference


def test_a_sampled_request_sent_back_to_the_batch_keeps_sampling_and_returns(runners, one_row):
    spec = one_row
    driver = PlanDriver(spec)
    driver.step(new=[new("a", params=SAMPLED)])
    while len(driver.outputs["a"]) < 10:
        driver.step()
    assert spec._speculating is not None and spec._speculating.handle.sampler is not None
    driver.step(new=[new("b", PROMPT_B, attrs.evolve(GREEDY, max_tokens=6))])
    assert spec._speculating is None
    during = driver.num_drafts
    driver.run_until_done()
    assert len(driver.outputs["a"]) == 40 and len(driver.outputs["b"]) == 6
    assert driver.num_drafts > during


class _SpoilingDrafter:
    """The real (pipelined) draft-model drafter, with every third round's second draft replaced by another token:
    rounds that reject follow rounds that accepted everything, so drafts made a round ahead get dropped."""

    needs_target_hidden = False

    def __init__(self, inner, vocab_size: int):
        self._inner, self._vocab_size, self._round = inner, vocab_size, 0

    def start(self, tokens, target_hidden) -> None:
        self._inner.start(tokens, target_hidden)

    def propose_lazy(self, last_token, num_tokens, pick=None):
        import mlx.core as mx

        drafts = self._inner.propose_lazy(last_token, num_tokens, pick)
        self._round += 1
        if self._round % 3 or drafts.size < 2:
            return drafts
        return mx.where(mx.arange(drafts.size) == 1, (drafts + 1) % self._vocab_size, drafts).astype(mx.uint32)

    def propose(self, last_token, num_tokens):
        raise AssertionError("a pipelined drafter is asked through propose_lazy")

    def draft_ahead(self, drafts, bonus, num_tokens, pick=None) -> None:
        self._inner.draft_ahead(drafts, bonus, num_tokens, pick)

    def settle(self, accepted, target_hidden) -> None:
        self._inner.settle(accepted, target_hidden)

    def stop(self) -> None:
        self._inner.stop()


def test_drafts_made_a_round_ahead_and_dropped_change_nothing(float32_dir, runners):
    from mlx_lm import load

    from vllm_mlx_trio.worker.speculative.draft_model import DraftModelDrafter

    plain, _ = runners
    reference, _ = alone(plain)
    drafter = _SpoilingDrafter(DraftModelDrafter(load(float32_dir)[0]), vocab_size=512)
    spec = build(spec_config(float32_dir, float32_dir), drafter=drafter)
    try:
        assert spec._pipelined
        output, driver = alone(spec)
    finally:
        spec.close()
    assert output == reference
    rounds = [r.spec_decode for r in driver.results if r.spec_decode is not None]
    assert any(c.num_accepted_tokens == 1 for c in rounds) and any(c.num_accepted_tokens == 4 for c in rounds)
