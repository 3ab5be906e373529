"""Prompts that arrive together (worker/batched/prefill_burst.py), on the real demo model: while more of the burst
waits, a
prompt's first token comes from its own prefill and no decode step runs; the burst's last prompt's step decodes
them all. Tokens, seeded samples and logprobs are what each prompt gives alone, and the prefix store keeps what a
burst prompt's cache holds."""

from __future__ import annotations

import pytest
import trio
from mlx_lm.generate import BatchGenerator
from spec.conftest import PlanDriver

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.messages import NewSequence, RequestId

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
PROMPTS = {"a": tuple(range(40, 70)), "b": tuple(range(100, 125)), "c": tuple(range(200, 240, 2))}
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def _runner(model_dir: str, *overrides: str):
    from vllm_mlx_trio.worker.registry import runner_for

    cfg = load_config(
        None,
        overrides=[f"model.path={model_dir}", "engine.run_ahead_steps=1", "cache.enabled=false", *overrides],
        environ={},
    )
    runner = runner_for(cfg)(cfg)
    runner.load()
    return runner


@pytest.fixture(scope="module")
def runner(float32_dir):
    made = _runner(float32_dir)
    yield made
    made.close()


def _seq(key: str, params: SamplingParams) -> NewSequence:
    return NewSequence(request_id=RequestId(key), prompt_token_ids=PROMPTS[key], params=params)


def _run(runner, params: dict[str, SamplingParams], monkeypatch) -> tuple[PlanDriver, list[int]]:
    """The keys of ``params`` arrive in one plan; the driver and the generator steps each plan ran."""
    calls: list[int] = []
    real = BatchGenerator.next

    def counted(self):
        calls.append(1)
        return real(self)

    monkeypatch.setattr(BatchGenerator, "next", counted)
    driver, steps = PlanDriver(runner), []
    driver.step(new=[_seq(key, p) for key, p in params.items()])
    steps.append(len(calls))
    while driver.active:
        before = len(calls)
        driver.step()
        steps.append(len(calls) - before)
    return driver, steps


def _alone(runner, key: str, params: SamplingParams, monkeypatch) -> list[int]:
    return _run(runner, {key: params}, monkeypatch)[0].outputs[key]


def _sampled_keys(driver: PlanDriver) -> list[set[str]]:
    return [{rid for rid, _ in result.sampled} for result in driver.results]


def test_a_bursts_first_tokens_come_from_their_own_prefills_and_the_last_step_decodes_all(runner, monkeypatch):
    driver, steps = _run(runner, dict.fromkeys(PROMPTS, GREEDY), monkeypatch)
    assert _sampled_keys(driver)[:3] == [{"a"}, {"b"}, {"c"}]  # one first token a plan, in arrival order
    assert steps[:3] == [0, 0, 1]  # no decode step until the burst's last prompt is in
    assert all(n == 1 for n in steps[3:])
    for key in PROMPTS:
        assert driver.outputs[key] == _alone(runner, key, GREEDY, monkeypatch), key


def test_seeded_samples_and_logprobs_are_what_each_prompt_gives_alone(runner, monkeypatch):
    params = {
        "a": SamplingParams(temperature=0.9, seed=7, max_tokens=8, ignore_eos=True),
        "b": SamplingParams(temperature=0.0, max_tokens=4, logprobs=2, ignore_eos=True),
        "c": GREEDY,
    }
    driver, steps = _run(runner, params, monkeypatch)
    assert steps[:2] == [0, 0]
    assert driver.outputs["a"] == _alone(runner, "a", params["a"], monkeypatch)
    burst_logprobs = [lp for r in driver.results for rid, lps in r.logprobs if rid == "b" for lp in lps]
    alone_driver, _ = _run(runner, {"b": params["b"]}, monkeypatch)
    alone_logprobs = [lp for r in alone_driver.results for _, lps in r.logprobs for lp in lps]
    assert [lp.token_id for lp in burst_logprobs] == [lp.token_id for lp in alone_logprobs]
    assert len(burst_logprobs) == 4 and len(burst_logprobs[0].top) == 2
    for burst, alone in zip(burst_logprobs, alone_logprobs, strict=True):  # the first one from the prefill
        assert burst.logprob == pytest.approx(alone.logprob, abs=1e-4)
        assert [t for t, _ in burst.top] == [t for t, _ in alone.top]


def test_a_row_with_logits_processors_takes_the_generators_step(runner, monkeypatch):
    penalized = SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3, ignore_eos=True)
    driver, steps = _run(runner, {"a": GREEDY, "b": penalized, "c": GREEDY}, monkeypatch)
    assert steps[:3] == [0, 1, 1]  # "a" from its prefill; "b" through the generator, which decodes "a" too
    assert driver.outputs["b"] == _alone(runner, "b", penalized, monkeypatch)


def test_a_burst_beyond_one_prefill_step_decodes_every_plan(runner, float32_dir, monkeypatch):
    small = _runner(float32_dir, "engine.prefill_step_size=16")
    try:
        driver, steps = _run(small, dict.fromkeys(PROMPTS, GREEDY), monkeypatch)
    finally:
        small.close()
    assert all(n == 1 for n in steps)  # no burst path: the remainder never fits one 16-token step
    for key in PROMPTS:
        assert driver.outputs[key] == _alone(runner, key, GREEDY, monkeypatch), key


async def test_a_burst_prompts_cache_goes_to_the_prefix_store_and_a_repeat_hits_it(float32_dir, monkeypatch):
    from vllm_mlx_trio.worker.batched.generator_join import JoinedRows

    joins: list[int] = []
    real = JoinedRows.join_sampled

    def counted(self, *args, **kwargs):
        joins.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(JoinedRows, "join_sampled", counted)
    cfg = load_config(None, overrides=[f"model.path={float32_dir}", "cache.block_size=16"], environ={})
    prompts = [
        f"Burst number {i}: the sea and the sky were calm that morning, and the boats went out" for i in range(4)
    ]
    firsts: dict[int, list[int]] = {}

    async def one(i: int) -> None:
        firsts[i] = [t async for d in engine.generate(prompts[i], GREEDY) for t in d.token_ids]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            async with trio.open_nursery() as nursery:
                for i in range(len(prompts)):
                    nursery.start_soon(one, i)
            assert joins  # the burst path ran
            hits = engine.statistics().cache.num_hits
            for i in range(len(prompts)):
                with await engine.submit(prompts[i], GREEDY) as stream:
                    again = [t async for d in stream for t in d.token_ids]
                    assert stream.usage.cached_tokens > 0
                assert again == firsts[i], i
            assert engine.statistics().cache.num_hits - hits == len(prompts)
