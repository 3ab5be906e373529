"""``engine.prefill_step_size_decoding`` on the real demo model: a long prompt arriving while a
stream decodes is prefilled in the small chunk (many steps, each decoding the stream), alone in
the full one, and its greedy output is the same either way."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config

pytestmark = pytest.mark.mlx

TIMEOUT_S = 120
GREEDY = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
LONG_PROMPT = [{"role": "user", "content": "the sea and the sky " * 120}]  # ~600 tokens
SHORT_PROMPT = [{"role": "user", "content": "Tell me about number 1 and the sea."}]


def config(model_dir: str, *overrides: str):
    # One decode step per plan (no run-ahead, which is timed): the tests count stream tokens per step.
    steps = "engine.run_ahead_steps=1"
    return load_config(None, overrides=[f"model.path={model_dir}", steps, *overrides], environ={})


async def _tokens(engine, prompt, params, on_token=lambda: None) -> list[int]:
    out: list[int] = []
    async for delta in engine.generate(prompt, params):
        out.extend(delta.token_ids)
        for _ in delta.token_ids:
            on_token()
    return out


async def _arrival(engine) -> tuple[list[str], list[int]]:
    """A short stream decodes; once it has 5 tokens the long prompt arrives. The arrivals in
    order ("s" a stream token, "L" a long-prompt token) and the long prompt's tokens."""
    arrivals: list[str] = []
    streaming = trio.Event()
    long_tokens: list[int] = []

    def stream_token():
        arrivals.append("s")
        if arrivals.count("s") >= 5:
            streaming.set()

    async def long():
        await streaming.wait()
        arrivals.append("L-submitted")
        long_tokens.extend(await _tokens(engine, LONG_PROMPT, GREEDY, lambda: arrivals.append("L")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_tokens, engine, SHORT_PROMPT, attrs.evolve(GREEDY, max_tokens=300), stream_token)
        nursery.start_soon(long)
    return arrivals, long_tokens


@pytest.mark.parametrize(
    ("decoding_chunk", "time_ratio"),
    [("16", "none"), ("none", "none"), ("32", "1.0")],
    ids=["generator-16", "generator-full", "runner-timed"],
)
async def test_the_chunk_is_small_while_a_stream_decodes_and_the_output_is_the_same(
    float32_dir, decoding_chunk, time_ratio
):
    """mlx-lm's prefill (time ratio none) in fixed chunks, and the runner's own prefill in
    timed chunks of at most prefill_step_size_decoding."""
    cfg = config(
        float32_dir,
        "engine.prefill_step_size=512",
        f"engine.prefill_step_size_decoding={decoding_chunk}",
        f"engine.prefill_time_ratio={time_ratio}",
    )
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:  # its own engine: the prefix cache would hold the prompt
            alone = await _tokens(engine, LONG_PROMPT, GREEDY)
        async with open_engine(cfg) as engine:
            arrivals, beside = await _arrival(engine)
    window = arrivals[arrivals.index("L-submitted") : arrivals.index("L")]
    if decoding_chunk != "none":  # ~600 prompt tokens, at most 16 or 32 per step: each step decodes the stream
        assert window.count("s") >= 600 // int(decoding_chunk) - 2
    else:  # 512-token chunks: the prompt takes two steps; the window also holds the steps the stream
        # decodes while admission renders and tokenizes the prompt (a few, more on a loaded machine),
        # still well under the chunked cases' >= 35
        assert window.count("s") < 20
    assert beside == alone and len(alone) == GREEDY.max_tokens


@pytest.mark.parametrize("time_ratio", ["1.0", "none"])
async def test_the_runner_prefills_the_prompt_itself_unless_the_time_ratio_is_none(
    float32_dir, monkeypatch, time_ratio
):
    """With a time ratio no prompt token goes through mlx-lm's prompt path (and its per-step
    eval and cache clearing): the runner's prefill computes all but the last one."""
    from mlx_lm.generate import PromptProcessingBatch

    from vllm_mlx_trio.worker.batched.prefill import PromptPrefill

    by_generator, by_runner = [], []
    generator_prompt, runner_step = PromptProcessingBatch.prompt, PromptPrefill.step

    def spy_generator(self, tokens):
        by_generator.extend(len(t) for t in tokens)
        return generator_prompt(self, tokens)

    budgets = []

    def spy_runner(self, budget, **kw):
        done = runner_step(self, budget, **kw)
        by_runner.append(done[0])
        budgets.append(budget)
        return done

    monkeypatch.setattr(PromptProcessingBatch, "prompt", spy_generator)
    monkeypatch.setattr(PromptPrefill, "step", spy_runner)
    cfg = config(
        float32_dir,
        f"engine.prefill_time_ratio={time_ratio}",
        "engine.prefill_step_size_decoding=32",
        "cache.enabled=false",
    )
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            arrivals, _ = await _arrival(engine)
    assert "L" in arrivals
    if time_ratio == "none":
        assert sum(by_generator) > 500 and not by_runner
    else:  # the short prompt alone in a full chunk; the long one beside its stream in timed chunks
        assert sum(by_runner) > 500 and sum(by_generator) == 0
        assert budgets[0] == 512 and max(budgets[1:]) <= 32


async def test_prompts_arriving_together_are_prefilled_back_to_back_in_full_chunks(float32_dir, monkeypatch):
    """No row was decoding when they came: the second is not held to the first one's pace."""
    from vllm_mlx_trio.worker.batched.prefill import PromptPrefill

    budgets, runner_step = [], PromptPrefill.step

    def spy_runner(self, budget, **kw):
        budgets.append(budget)
        return runner_step(self, budget, **kw)

    monkeypatch.setattr(PromptPrefill, "step", spy_runner)
    cfg = config(float32_dir, "engine.prefill_step_size=128", "cache.enabled=false")
    together = [[{"role": "user", "content": f"{i} " + "the sea and the sky " * 200}] for i in range(2)]
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine, trio.open_nursery() as nursery:
            for prompt in together:
                nursery.start_soon(_tokens, engine, prompt, GREEDY)
    assert len(budgets) >= 4 and set(budgets) == {128}


@pytest.mark.parametrize("chunk_window_ms", [60000, 0])
async def test_beside_a_stream_a_plan_runs_ahead_after_its_chunk(float32_dir, monkeypatch, chunk_window_ms):
    """Run-ahead on: while the long prompt is prefilled beside the stream, a plan carries one
    timed chunk and then several decode steps (one with engine.chunk_run_ahead_ms = 0), and the
    long prompt's greedy output is what it is alone."""
    from vllm_mlx_trio.worker.batched import runner as batch_runner
    from vllm_mlx_trio.worker.batched.prefill import PromptPrefill

    events: list[str] = []  # "C": a timed chunk, "g": a decode step (BatchGenerator.next)
    runner_step, generator_step = PromptPrefill.step, batch_runner.BatchRunner._generator_step

    def spy_runner(self, budget, **kw):
        if kw.get("wait"):
            events.append("C")
        return runner_step(self, budget, **kw)

    def spy_generator(self, prompts_done):
        events.append("g")
        return generator_step(self, prompts_done)

    monkeypatch.setattr(PromptPrefill, "step", spy_runner)
    monkeypatch.setattr(batch_runner.BatchRunner, "_generator_step", spy_generator)
    # 60000: no time limit, the steps limit; 0: one decode step per chunk
    window = f"engine.chunk_run_ahead_ms={chunk_window_ms}"
    chunk = "engine.prefill_step_size_decoding=32"  # ~600 prompt tokens: about 19 chunks
    cfg = config(float32_dir, "engine.run_ahead_steps=4", window, chunk, "cache.enabled=false")
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg) as engine:
            alone = await _tokens(engine, LONG_PROMPT, GREEDY)
            events.clear()
            _arrivals, beside = await _arrival(engine)
    between = "".join(events).strip("g").split("C")[1:-1]  # decode steps after each timed chunk
    assert len(between) >= 600 // 32 - 2
    if chunk_window_ms:
        assert all(1 <= len(steps) <= 4 for steps in between) and sum(map(len, between)) >= 2 * len(between)
    else:
        assert all(len(steps) == 1 for steps in between)
    assert beside == alone
