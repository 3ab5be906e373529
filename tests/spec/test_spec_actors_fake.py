"""Speculation's counts through the actors, on the real executor with a fake runner (no MLX): each step's
``StepResult.spec_decode`` reaches the vLLM-named counters and ``/v1/status``; and the runner choice."""

from __future__ import annotations

import attrs
import pytest
import trio

from vllm_mlx_trio import SamplingParams, open_engine
from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.core.speculative import SpecDecodeCounts
from vllm_mlx_trio.errors import ConfigError
from vllm_mlx_trio.http.ops_routes import ThroughputMeter, status_body
from vllm_mlx_trio.testing.fake_runner import FakeRunner
from vllm_mlx_trio.worker.registry import runner_for, with_runner

TIMEOUT_S = 30


class CountingKind(FakeRunner):
    """Gives 1..4 tokens a step and reports each multi-token step as a verify round of 3 drafts."""

    tokens_per_step = (1, 4, 2)

    def execute(self, plan):
        result = super().execute(plan)
        rounds = [SpecDecodeCounts.of_round(3, len(tokens) - 1) for _, tokens in result.sampled]
        total = sum(rounds, SpecDecodeCounts())
        return attrs.evolve(result, spec_decode=total if total.num_drafts else None)


async def test_step_counts_reach_the_metrics_and_the_status():
    runners = with_runner("fake-counting", CountingKind)
    cfg = load_config(None, overrides=["engine.mode=fake-counting"], environ={}, engine_modes=runners)
    params = SamplingParams(max_tokens=21, ignore_eos=True)
    with trio.fail_after(TIMEOUT_S):
        async with open_engine(cfg, runners=runners) as engine:
            tokens = [t async for d in engine.generate("hello", params) for t in d.token_ids]
            counts = engine.metrics.spec_decode
            rendered = engine.metrics.render().decode()
            status = status_body(engine, ThroughputMeter.for_engine(engine))
    assert len(tokens) == 21
    # steps give 1, 4, 2, 1, 4, 2, ... tokens until 21: each a round of 3 drafts with k - 1 accepted
    assert counts.num_drafts > 0 and counts.num_draft_tokens == 3 * counts.num_drafts
    assert counts.num_accepted_tokens + counts.num_drafts == 21
    assert f'vllm:spec_decode_num_drafts_total{{model_name="demo:tiny"}} {float(counts.num_drafts)}' in rendered
    accepted = float(counts.num_accepted_tokens)
    assert f'vllm:spec_decode_num_accepted_tokens_total{{model_name="demo:tiny"}} {accepted}' in rendered
    first = float(counts.accepted_per_position[0])
    per_position = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="demo:tiny",position="0"}'
    assert f"{per_position} {first}" in rendered
    assert status["speculative"] == {
        "method": "off",
        "drafts": counts.num_drafts,
        "draft_tokens": counts.num_draft_tokens,
        "accepted_tokens": counts.num_accepted_tokens,
        "acceptance_rate": round(counts.acceptance_rate, 4),
        "mean_accepted_length": round(counts.mean_accepted_length, 3),
    }


def test_speculation_needs_the_batched_mode():
    with pytest.raises(ConfigError, match='needs engine.mode = "auto", "batched" or "vlm"'):
        load_config(None, overrides=["engine.mode=simple", "speculative.method=mtp"], environ={})
    with pytest.raises(ConfigError, match="needs speculative.method"):
        load_config(None, overrides=["engine.mode=speculative"], environ={})
    speculative = load_config(None, overrides=["engine.mode=speculative", "speculative.method=mtp"], environ={})
    assert runner_for(speculative).__name__ == "SpecRunner"


def test_draft_method_needs_a_draft_model():
    with pytest.raises(ConfigError, match="speculative.draft_model: must be set"):
        load_config(None, overrides=["speculative.method=draft"], environ={})


def test_the_speculative_runner_budgets_num_draft_tokens_plus_one():
    cfg = load_config(
        None,
        overrides=[
            "speculative.method=draft",
            "speculative.draft_model=demo:spec-draft",
            "speculative.num_draft_tokens=6",
        ],
        environ={},
    )
    # "auto" decides between the speculative kinds when the model loads; both have the speculative shape
    assert runner_for(cfg).__name__ == "AutoRunner" and runner_for(cfg).shape(cfg).max_tokens_per_step == 7
    batched = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode="batched"))
    vlm = attrs.evolve(cfg, engine=attrs.evolve(cfg.engine, mode="vlm"))
    assert runner_for(batched).__name__ == "SpecRunner" and runner_for(batched).shape(batched).max_tokens_per_step == 7
    assert runner_for(vlm).__name__ == "VlmSpecRunner" and runner_for(vlm).shape(vlm).max_tokens_per_step == 7
    default = load_config(None, environ={})
    assert runner_for(default).shape(default).max_tokens_per_step == 1
