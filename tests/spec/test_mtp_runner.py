"""``[speculative] method = "mtp"`` on demo:mtp-tiny through the speculative runner: output identical to the plain
batched runner, drafts accepted, the hybrid cache rolled back through the transaction; thinking requests stay off
speculation unless thinking_retirement_resume is on."""

from __future__ import annotations

import pathlib

import attrs
import pytest

from vllm_mlx_trio.core.params import SamplingParams
from vllm_mlx_trio.messages import NewSequence, RequestId
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter

from .conftest import PlanDriver
from .mtp_parts import alone, build_runner, mtp_config, plain_and_mtp_runners, recorded_modes, spec_counts

pytestmark = pytest.mark.mlx

GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
PROMPTS = (tuple(range(40, 60)), (300, 7, 250, 19, 88, 120, 64), tuple(range(200, 230, 3)))


@pytest.fixture(scope="module")
def mtp_dir(tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    return str(build_demo_model(tmp_path_factory.mktemp("mtp") / "mtp-tiny", size="mtp-tiny"))


@pytest.fixture(scope="module")
def runners(mtp_dir):
    yield from plain_and_mtp_runners(mtp_dir)


def _alone(runner, prompt, params=GREEDY, output: tuple[int, ...] = ()) -> tuple[list[int], PlanDriver]:
    return alone(runner, prompt, params, output)


def test_the_mtp_method_loads_the_mtp_drafter(runners):
    _, spec = runners
    assert type(spec).__name__ == "SpecRunner"
    assert isinstance(spec._drafter, MTPDrafter) and spec._drafter.hidden_state_mode == "post_norm"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_with_mtp_equals_without_and_drafts_are_accepted(runners, prompt):
    plain, spec = runners
    reference, _ = _alone(plain, prompt)
    output, driver = _alone(spec, prompt)
    assert output == reference
    proposed, accepted = spec_counts(driver)
    assert proposed > 0 and accepted > 0
    assert max(len(tokens) for r in driver.results for _, tokens in r.sampled) > 1  # runs of accepted drafts


def test_max_tokens_inside_a_run(runners):
    plain, spec = runners
    for max_tokens in (2, 5, 9):
        params = attrs.evolve(GREEDY, max_tokens=max_tokens)
        assert _alone(spec, PROMPTS[0], params)[0] == _alone(plain, PROMPTS[0], params)[0]


# -- thinking requests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def think_tokens(mtp_dir) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The demo tokenizer's pieces of "<think>", and of a thought closed by "</think>"."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(pathlib.Path(mtp_dir))
    return tuple(tokenizer.encode("<think>")), tuple(tokenizer.encode("some thought</think>"))


@pytest.mark.parametrize("resume", [False, True])
def test_a_thinking_request_speculates_after_its_reasoning_only_with_the_opt_in(
    mtp_dir, runners, think_tokens, resume, monkeypatch
):
    """The prompt opens the thinking block; the request comes back (as after a preemption) with the block closed in
    its output. Default: it never speculates; with the opt-in: it does, from there on. Output identical either way."""
    monkeypatch.delenv("VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME", raising=False)
    plain, _ = runners
    opener, closed = think_tokens
    prompt = (*PROMPTS[0], *opener)
    extra = ["model.reasoning_parser=qwen3", f"speculative.thinking_retirement_resume={str(resume).lower()}"]
    spec = build_runner(mtp_config(mtp_dir, *extra))
    try:
        still_thinking, driver_thinking = _alone(spec, prompt)
        after, driver_after = _alone(spec, prompt, output=closed)
    finally:
        spec.close()
    assert still_thinking == _alone(plain, prompt)[0]
    assert after == _alone(plain, prompt, output=closed)[0]
    assert spec_counts(driver_thinking)[0] == 0  # inside the block: never
    assert (spec_counts(driver_after)[0] > 0) is resume


def test_the_environment_variable_turns_the_opt_in_on(mtp_dir, think_tokens, monkeypatch):
    monkeypatch.setenv("VLLM_MLX_ENABLE_THINKING_RETIREMENT_RESUME", "1")
    opener, closed = think_tokens
    spec = build_runner(mtp_config(mtp_dir, "model.reasoning_parser=qwen3"))
    try:
        _, driver = _alone(spec, (*PROMPTS[0], *opener), output=closed)
    finally:
        spec.close()
    assert spec_counts(driver)[0] > 0


def test_pre_norm_from_the_config_reaches_the_verify_forward_and_changes_no_token(mtp_dir, runners, monkeypatch):
    modes = recorded_modes(monkeypatch)
    plain, _ = runners
    spec = build_runner(mtp_config(mtp_dir, "speculative.hidden_state_mode=pre_norm"))
    try:
        output, driver = _alone(spec, PROMPTS[1])
    finally:
        spec.close()
    assert output == _alone(plain, PROMPTS[1])[0]
    assert modes and set(modes) == {"pre_norm"} and spec_counts(driver)[0] > 0


def test_a_model_without_mtp_weights_is_refused_at_load(float32_dir):
    from vllm_mlx_trio.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="mtp"):
        build_runner(mtp_config(float32_dir))


def test_a_second_request_sends_the_first_back_and_it_returns_with_a_fresh_head(runners, mtp_dir):
    """The one-row path (taken when the head cannot draft for a batch: here made so)."""
    plain, _ = runners
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MTPDrafter, "batch", lambda self: None)
        spec = build_runner(mtp_config(mtp_dir))
    try:
        _second_request_round_trip(plain, spec)
    finally:
        spec.close()


def _second_request_round_trip(plain, spec) -> None:
    assert spec._spec_batch is None
    second = attrs.evolve(GREEDY, max_tokens=6)
    ref_a, _ = _alone(plain, PROMPTS[0])
    ref_b, _ = _alone(plain, PROMPTS[1], second)
    driver = PlanDriver(spec)
    driver.step(new=[NewSequence(request_id=RequestId("a"), prompt_token_ids=PROMPTS[0], params=GREEDY)])
    while len(driver.outputs["a"]) < 10:
        driver.step()
    assert spec._speculating is not None
    driver.step(new=[NewSequence(request_id=RequestId("b"), prompt_token_ids=PROMPTS[1], params=second)])
    assert spec._speculating is None and spec._drafter.cached_positions == 0  # the head's state was freed
    during = spec_counts(driver)[0]
    driver.run_until_done()
    assert driver.outputs["a"] == ref_a and driver.outputs["b"] == ref_b
    assert spec_counts(driver)[0] > during  # drafting again once alone


def test_the_first_round_after_entering_from_the_batch_drafts_from_the_batch_hidden_state(runners):
    """A sequence enters speculation from the batched path; the batch's last forward already computed the hidden
    state before its pending token, so the first round drafts (and the constructed head's drafts get accepted)."""
    from vllm_mlx_trio.core.spec_rule import DraftRule

    _, spec = runners
    first_rounds = []
    for prompt in PROMPTS:
        spec._rule = DraftRule(3)  # a fresh rule drafts the most first (the batched path; the one-row path always)
        _, driver = _alone(spec, prompt)
        first_rounds.append(next(r.spec_decode for r in driver.results if r.spec_decode is not None))
    assert all(c.num_draft_tokens == 3 for c in first_rounds)  # without the hidden state: no drafts at all
    assert sum(c.num_accepted_tokens for c in first_rounds) > 0
    assert spec._entry_hidden is not None and spec._entry_hidden.num_tracked == 0  # taken, nothing left behind


def test_an_unseeded_sampled_request_speculates_with_the_mtp_head(runners):
    """The head's drafts are sampled from its own distribution and judged by rejection sampling."""
    _, spec = runners
    params = SamplingParams(temperature=0.7, max_tokens=40, ignore_eos=True)
    output, driver = _alone(spec, PROMPTS[0], params)
    assert len(output) == 40
    proposed, accepted = spec_counts(driver)
    assert proposed > 0 and accepted > 0


def test_several_rows_of_a_hybrid_target_speculate_together_and_change_no_token(runners):
    """demo:mtp-tiny's GatedDeltaNet layers cannot be trimmed: rows accepting different counts roll back through the
    batched cache transaction (worker/speculative/batch_txn.py, a ragged replay of the recorded mixer inputs)."""
    from .test_spec_batch_real import CorruptingDrafts, new, together

    plain, spec = runners
    assert spec._spec_batch is not None
    sequences = [
        new(f"r{i}", PROMPTS[i % len(PROMPTS)][i:], attrs.evolve(GREEDY, max_tokens=18 + 3 * i)) for i in range(3)
    ]
    reference = together(plain, sequences).outputs
    inner = spec._spec_batch._draft
    spec._spec_batch._draft = wrapper = CorruptingDrafts(inner, rate=0.2, seed=2)
    try:
        driver = together(spec, sequences)
    finally:
        spec._spec_batch._draft = inner
    assert dict(driver.outputs) == dict(reference)
    assert wrapper.ragged_rounds > 0
    proposed, accepted = spec_counts(driver)
    assert 0 < accepted < proposed
