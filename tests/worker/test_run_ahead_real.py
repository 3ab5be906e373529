"""Run-ahead on the real demo model: a decode-only plan runs several steps, and what comes
out (tokens, logprobs, the finish at max_tokens or a stop token) is what one step a plan gives."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.testing.requests import chat
from vllm_mlx_trio.worker.batched import runner as batch_runner
from vllm_mlx_trio.worker.runner_base import LiveSequence

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
EOS = 2  # <|im_end|> in the demo tokenizer
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)


#: The question of request number i: ``chat(QUESTION.format(i))``.
QUESTION = "Tell me about number {} and the sea."


async def deltas_of(
    model_dir: str, jobs: dict[str, tuple[list[dict], SamplingParams]], *overrides: str
) -> dict[str, list]:
    """Each job's deltas, all jobs at once on one engine."""
    cfg = load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})
    results: dict[str, list] = {}

    async def one(key: str, prompt: list[dict], params: SamplingParams) -> None:
        results[key] = [delta async for delta in engine.generate(prompt, params)]

    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine, trio.open_nursery() as nursery:
            for key, (prompt, params) in jobs.items():
                nursery.start_soon(one, key, prompt, params)
    return results


def tokens(deltas: list) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


JOBS = {
    "alone": (chat(QUESTION.format(1)), GREEDY),
    "logprobs": (chat(QUESTION.format(2)), SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True)),
    "eos": (
        chat(QUESTION.format(3)),
        SamplingParams(temperature=0.0, max_tokens=30, logit_bias=((EOS, 100.0),), min_tokens=5),
    ),
}


async def test_run_ahead_gives_what_one_step_a_plan_gives(float32_dir, monkeypatch):
    one_step = await deltas_of(float32_dir, JOBS, "engine.run_ahead_steps=1")
    published = []  # steps handed over while their plan ran on
    publish = batch_runner.BatchRunner._publish

    def counted(runner, advance):
        published.extend(e.request_id for e in advance.emissions)
        return publish(runner, advance)

    monkeypatch.setattr(batch_runner.BatchRunner, "_publish", counted)
    ahead = await deltas_of(
        float32_dir,
        JOBS,
        "engine.run_ahead_steps=8",
        "engine.run_ahead_ms=60000",
        "engine.solo_run_ahead_steps=8",
        "engine.solo_run_ahead_ms=60000",
    )  # steps limit
    assert max(len(d.token_ids) for d in one_step["alone"]) == 1
    assert len(published) > len(JOBS)  # several steps in one plan
    assert max(len(d.token_ids) for d in ahead["alone"]) == 1  # yet each token left as its step ended
    for key in JOBS:
        assert tokens(ahead[key]) == tokens(one_step[key]), key
        assert ahead[key][-1].finish_reason == one_step[key][-1].finish_reason, key
    assert len(tokens(ahead["alone"])) == GREEDY.max_tokens
    assert len(tokens(ahead["eos"])) == 6 and tokens(ahead["eos"])[-1] == EOS  # 5 (min_tokens), then EOS
    assert ahead["eos"][-1].finish_reason == "stop"
    logprobs = [lp for d in ahead["logprobs"] for lp in d.logprobs]
    assert [lp.token_id for lp in logprobs] == tokens(ahead["logprobs"])
    assert logprobs == [lp for d in one_step["logprobs"] for lp in d.logprobs]


def test_the_run_ahead_stays_within_the_kv_budget_and_the_schedulers_headroom():
    runner = batch_runner.BatchRunner(load_config(None, environ={}))
    rows = [LiveSequence(SimpleNamespace(prompt_token_ids=(1,) * 20), None, emitted=[5] * extra) for extra in (0, 2)]
    runner._info = SimpleNamespace(kv_budget_tokens=None)
    assert runner._kv_fits(rows, 1000)
    # 2 rows x (22 tokens + steps + 3 tokens of the scheduler's headroom) <= 100: up to 25 steps
    runner._info = SimpleNamespace(kv_budget_tokens=100)
    assert runner._kv_fits(rows, 25)
    assert not runner._kv_fits(rows, 26)


def _driven_runner(model_dir: str, *overrides: str, num_rows: int = 1):
    """A loaded runner and ``plan(step_id, start=)``: a plan starting ``num_rows`` sequences, or
    decoding them."""
    from vllm_mlx_trio.messages import NewSequence, RequestId, StepPlan

    cfg = load_config(None, overrides=[f"model.path={model_dir}", *overrides], environ={})
    runner = batch_runner.BatchRunner(cfg)
    runner.load()
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    new = tuple(
        NewSequence(request_id=RequestId(f"r{i}"), prompt_token_ids=tuple(range(10 + i, 40)), params=params)
        for i in range(num_rows)
    )

    def plan(step_id: int, *, start: bool = False) -> StepPlan:
        if start:
            return StepPlan(step_id=step_id, new_seqs=new)
        return StepPlan(step_id=step_id, decode_ids=tuple(seq.request_id for seq in new))

    return runner, plan


@pytest.mark.parametrize(("num_rows", "steps_per_plan"), [(1, 6), (2, 3)])
def test_a_lone_row_runs_ahead_by_the_solo_bounds(float32_dir, num_rows, steps_per_plan):
    """One row in the batch: a decode plan runs engine.solo_run_ahead_steps; two rows:
    engine.run_ahead_steps (no time limit binds here)."""
    runner, plan = _driven_runner(
        float32_dir,
        "engine.run_ahead_steps=3",
        "engine.run_ahead_ms=60000",
        "engine.solo_run_ahead_steps=6",
        "engine.solo_run_ahead_ms=60000",
        num_rows=num_rows,
    )
    try:
        runner.execute(plan(0, start=True))
        # the first decode plans give each row's first token and drop the step that hands it back
        sizes = [[len(tokens) for _rid, tokens in runner.execute(plan(step_id)).sampled] for step_id in range(1, 5)]
        assert sizes[-2:] == [[steps_per_plan] * num_rows] * 2
    finally:
        runner.close()


def greedy_reference(runner, num_tokens: int) -> list[int]:
    """mlx-lm's own greedy continuation of the driven runner's prompt."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    steps = generate_step(
        mx.array(list(range(10, 40))),
        runner._generator.model,
        max_tokens=num_tokens,
        sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
    )
    return [int(token) for token, _logprobs in steps]


@pytest.mark.parametrize("time_limit_s", [0.0, 60.0])
def test_the_plan_that_starts_a_prompt_gives_its_first_token_and_ends_there(float32_dir, time_limit_s):
    """Time to first token: the plan that prefills a prompt alone gives its first token from the
    step that ends the prompt (whatever the time limit: 0 lets no step join for time's sake) and
    stops at it (60 s would let 8 steps join); the next plan runs ahead: 8 steps, whose first
    hands back the token already emitted (dropped), so 7 tokens."""
    runner, plan = _driven_runner(
        float32_dir, f"engine.solo_run_ahead_ms={time_limit_s * 1000}", "engine.solo_run_ahead_steps=8"
    )
    try:
        first = runner.execute(plan(0, start=True))
        assert [len(tokens) for _rid, tokens in first.sampled] == [1]
        runner._solo_window_s = 60.0  # now only the steps limit
        second = runner.execute(plan(1))
        assert [len(tokens) for _rid, tokens in second.sampled] == [7]
        assert first.sampled[0][1] + second.sampled[0][1] == tuple(greedy_reference(runner, 8))
    finally:
        runner.close()


@pytest.mark.parametrize(("prefill_time_ratio", "forwards"), [("0.5", 1), ("none", 2)])
def test_a_prompts_first_token_leaves_with_the_step_that_sampled_it(float32_dir, prefill_time_ratio, forwards):
    """With one step a plan: the runner's own prefill hands the prompt to the generator, whose
    first step computes its last token and samples the first output token; mlx-lm's own path
    takes a step for the prompt and one for its last token. Either way that token leaves with the
    step that sampled it, not after the next forward (where mlx-lm hands it out)."""
    runner, plan = _driven_runner(
        float32_dir, "engine.run_ahead_steps=1", f"engine.prefill_time_ratio={prefill_time_ratio}"
    )
    steps = 0
    next_step = runner._generator.next

    def counted():
        nonlocal steps
        steps += 1
        return next_step()

    runner._generator.next = counted
    try:
        result = runner.execute(plan(0, start=True))
        step_id = 1
        while not result.sampled:
            result, step_id = runner.execute(plan(step_id)), step_id + 1
        assert steps == forwards
        assert [tokens for _rid, tokens in result.sampled] == [tuple(greedy_reference(runner, 1))]
    finally:
        runner.close()
