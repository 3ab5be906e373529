"""``[speculative] method = "mtp"`` on demo:mtp-dsv3 (a DeepSeek-V3 target with its layer-N MTP module): through the
speculative runner and the whole engine, the same tokens as without speculation (across a stop string and with
max_tokens landing inside an accepted run), drafts accepted and counted in the spec metrics, the hidden-state mode
of the config reaching the verify forward."""

from __future__ import annotations

import re

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter
from vllm_mlx_trio.worker.speculative.mtp.head_deepseek import DeepseekMTPHead

from .conftest import PlanDriver, spec_config
from .mtp_parts import alone, build_runner, generate, mtp_config, plain_and_mtp_runners, recorded_modes, spec_counts

pytestmark = pytest.mark.mlx

TIMEOUT_S = 180
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
CHAT = [{"role": "user", "content": "Tell me about the sea and the ships."}]
PROMPT = tuple(range(40, 60))


@pytest.fixture(scope="module")
def dsv3_dir(tmp_path_factory) -> str:
    from vllm_mlx_trio.worker.demo import build_demo_model

    return str(build_demo_model(tmp_path_factory.mktemp("mtp-dsv3") / "mtp-dsv3", size="mtp-dsv3"))


@pytest.fixture(scope="module")
def runners(dsv3_dir):
    yield from plain_and_mtp_runners(dsv3_dir)


def _alone(runner, params=GREEDY) -> tuple[list[int], PlanDriver]:
    return alone(runner, PROMPT, params)


def test_the_runner_drafts_with_the_deepseek_head_and_changes_no_token(runners):
    plain, spec = runners
    assert isinstance(spec._drafter, MTPDrafter) and isinstance(spec._drafter.head, DeepseekMTPHead)
    reference, _ = _alone(plain)
    output, driver = _alone(spec)
    assert output == reference
    proposed, accepted = spec_counts(driver)
    assert proposed > 0 and accepted > 0
    assert max(len(tokens) for r in driver.results for _, tokens in r.sampled) > 1  # runs of accepted drafts


def test_max_tokens_inside_an_accepted_run(runners):
    """Runs are 4 tokens (3 drafts + the bonus) here; these limits fall inside one, which then ends short."""
    plain, spec = runners
    last_emissions = []
    for max_tokens in (3, 7, 12):
        params = attrs.evolve(GREEDY, max_tokens=max_tokens)
        output, driver = _alone(spec, params)
        assert output == _alone(plain, params)[0] and len(output) == max_tokens
        last_emissions.append(len(driver.results[-1].sampled[0][1]))
    assert any(1 < n < 4 for n in last_emissions), last_emissions


def test_pre_norm_from_the_config_reaches_the_verify_forward_and_changes_no_token(dsv3_dir, runners, monkeypatch):
    modes = recorded_modes(monkeypatch)
    plain, _ = runners
    spec = build_runner(mtp_config(dsv3_dir, "speculative.hidden_state_mode=pre_norm"))
    try:
        output, driver = _alone(spec)
    finally:
        spec.close()
    assert output == _alone(plain)[0]
    assert modes and set(modes) == {"pre_norm"} and spec_counts(driver)[1] > 0


async def _generate(engine, params) -> tuple[str, list[int], str | None]:
    return await generate(engine, CHAT, params)


async def test_through_the_engine_mtp_changes_no_token_and_counts_acceptance(dsv3_dir):
    short = attrs.evolve(GREEDY, max_tokens=7)
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(spec_config(dsv3_dir, None)) as engine:
            reference = await _generate(engine, GREEDY)
            stop = reference[0][len(reference[0]) // 2 : len(reference[0]) // 2 + 3]
            with_stop = attrs.evolve(GREEDY, stop=(stop,))
            reference_stopped = await _generate(engine, with_stop)
            reference_short = await _generate(engine, short)
        async with open_engine(mtp_config(dsv3_dir)) as engine:
            got = await _generate(engine, GREEDY)
            got_stopped = await _generate(engine, with_stop)
            got_short = await _generate(engine, short)
            counts = engine.metrics.spec_decode
            exposition = engine.metrics.render().decode()
    assert got == reference and got[2] == "length"
    assert got_stopped == reference_stopped and got_stopped[2] == "stop"
    assert got_short == reference_short and len(got_short[1]) == 7
    assert counts.num_drafts > 0 and counts.num_accepted_tokens > 0
    accepted = re.search(r"^vllm:spec_decode_num_accepted_tokens_total(?:\{[^}]*\})? (\S+)$", exposition, re.M)
    assert accepted is not None and float(accepted[1]) == counts.num_accepted_tokens


def test_several_rows_draft_with_the_head_in_one_round_and_change_no_token(runners):
    """demo:mtp-dsv3's caches are plain attention caches: its rows speculate together (the head batched,
    worker/speculative/mtp/batch.py), each accepting its own count; a drafting head that sometimes errs makes them
    ragged. The outputs are the plain runner's."""
    from .test_spec_batch_real import CorruptingDrafts, checked_rows, new, together

    plain, spec = runners
    assert spec._spec_batch is not None
    prompts = (PROMPT, tuple(range(100, 112)), tuple(range(7, 40)))
    sequences = [new(f"r{i}", prompts[i], attrs.evolve(GREEDY, max_tokens=20 + 4 * i)) for i in range(3)]
    reference = together(plain, sequences).outputs
    inner = spec._spec_batch._draft
    spec._spec_batch._draft = wrapper = CorruptingDrafts(inner, rate=0.2, seed=1)
    try:
        driver = PlanDriver(spec)
        driver.step(new=sequences)
        while driver.active:
            driver.step()
            checked_rows(spec)
    finally:
        spec._spec_batch._draft = inner
    assert dict(driver.outputs) == dict(reference)
    assert wrapper.ragged_rounds > 0
    assert any(sum(len(tokens) > 1 for _, tokens in r.sampled) >= 2 for r in driver.results)
    proposed, accepted = spec_counts(driver)
    assert 0 < accepted < proposed
