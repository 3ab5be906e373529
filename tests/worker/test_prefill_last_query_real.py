"""A chunk that keeps only its last position's logits (a burst prompt's last chunk, worker/batched/prefill_burst.py)
runs the
model's last decoder layer on the chunk's positions but the last for their keys and values only, then on the last
(``_LastQueryOnly``): its logits and cache are those of the whole forward, on the real demo model."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.batched import runner as batch_runner
from vllm_mlx_trio.worker.batched.prefill import _split_masks, _splittable
from vllm_mlx_trio.worker.speculative.hidden import final_norm_owner

pytestmark = pytest.mark.mlx

PROMPT = tuple(range(40, 90))


@pytest.fixture(scope="module")
def runner(float32_dir):
    cfg = load_config(None, overrides=[f"model.path={float32_dir}"], environ={})
    made = batch_runner.BatchRunner(cfg)
    made.load()
    yield made
    made.close()


def _chunk(runner, tokens: tuple[int, ...], cached: int) -> tuple[mx.array, list, list[int]]:
    """The last-position logits of ``tokens[cached:]`` after ``tokens[:cached]``, the cache, and the positions the
    last layer's MLP was called with."""
    model, prefill = runner._generator.model, runner._prefill
    cache = make_prompt_cache(model)
    if cached:
        model(mx.array([tokens[:cached]]), cache=cache)
    last = final_norm_owner(model).layers[-1]
    mlp, calls = last.mlp, []

    def spied(x):
        calls.append(x.shape[1])
        return mlp(x)

    last.mlp = spied
    try:
        with prefill._last_position_only(True):
            logits = model(mx.array([tokens[cached:]]), cache=cache)
    finally:
        last.mlp = mlp
    mx.eval(logits, [c.state for c in cache])
    return logits, cache, calls


@pytest.mark.parametrize("cached", [0, 20, 48])
def test_the_last_layer_runs_the_last_position_alone_and_gives_the_whole_forwards_logits(runner, cached):
    logits, cache, calls = _chunk(runner, PROMPT, cached)
    # the chunk but its last position (an output MLX never computes), then the last
    assert calls == [len(PROMPT) - cached - 1, 1]
    whole_cache = make_prompt_cache(runner._generator.model)
    whole = runner._generator.model(mx.array([PROMPT]), cache=whole_cache)[:, -1:, :]
    assert logits.shape == whole.shape
    assert mx.allclose(logits, whole, atol=1e-4).item()
    for mine, theirs in zip(cache, whole_cache, strict=True):
        assert mine.offset == theirs.offset == len(PROMPT)
        assert mx.allclose(mine.state[0], theirs.state[0], atol=1e-4).item()


def test_with_a_recorder_the_final_norm_is_cut_instead(runner):
    runner._prefill.recorder = object()  # it reads every position's hidden state at the final norm
    try:
        logits, _cache, calls = _chunk(runner, PROMPT, 0)
    finally:
        runner._prefill.recorder = None
    assert calls == [len(PROMPT)]
    assert logits.shape[1] == 1


def test_only_a_causal_call_of_a_plain_layer_is_split(runner):
    x = mx.zeros((1, 5, 8))
    assert _split_masks(x, "causal") == ("causal", None)
    head, tail = _split_masks(x, mx.ones((5, 5), dtype=mx.bool_))
    assert head.shape == (4, 4) and tail.shape == (1, 5)
    assert _split_masks(x, None) is None  # a mask it does not know
    assert _split_masks(mx.zeros((1, 1, 8)), "causal") is None  # one position: nothing to split
    assert _splittable(final_norm_owner(runner._generator.model).layers[-1])

    def layer_with_more_inputs(x, mask, cache, shared_kv_states):  # may return more than its hidden states
        return x

    assert not _splittable(layer_with_more_inputs)
