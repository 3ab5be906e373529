"""The MTP drafter on demo:mtp-tiny, driven by a minimal greedy verify loop (the runner's round, written out):
output identical to plain greedy, drafts accepted on the agreeing head, the head's cache kept in step."""

from __future__ import annotations

import json
import pathlib

import mlx.core as mx
import mlx_lm
import pytest

from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.speculative.hidden import target_forward
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter
from vllm_mlx_trio.worker.speculative.mtp.head import load_mtp_head

from .mtp_parts import plain_greedy, speculative_greedy

pytestmark = pytest.mark.mlx

PROMPTS = ("Once upon a time", "The quick brown fox jumps", "In a hole in the ground there lived")
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def target(demo_cache_dir):
    path = resolve_demo_model("demo:mtp-tiny", demo_cache_dir)
    model, tokenizer = mlx_lm.load(str(path))
    return model, tokenizer, path


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_output_with_mtp_equals_plain_greedy_and_drafts_are_accepted(target, k):
    model, tokenizer, path = target
    drafter = MTPDrafter.for_target(model, path, hidden_state_mode=None)
    proposed = accepted = 0
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        got, p, a = speculative_greedy(model, drafter, prompt, NEW_TOKENS, k)
        assert got == plain_greedy(model, prompt, NEW_TOKENS)
        proposed, accepted = proposed + p, accepted + a
    assert proposed > 0
    assert accepted / proposed > 0.3  # the constructed head agrees often (measured ~0.7 at k=1)


def test_a_disagreeing_head_changes_only_acceptance(target):
    model, tokenizer, path = target
    drafter = MTPDrafter.for_target(model, path, hidden_state_mode=None)
    drafter.head.fc.weight = mx.random.normal(drafter.head.fc.weight.shape, key=mx.random.key(3)).astype(mx.bfloat16)
    prompt = tokenizer.encode(PROMPTS[0])
    got, proposed, accepted = speculative_greedy(model, drafter, prompt, NEW_TOKENS, 3)
    assert got == plain_greedy(model, prompt, NEW_TOKENS)
    assert proposed > 0 and accepted / proposed < 0.3


def test_the_head_cache_follows_the_target(target):
    """After each settle the head holds one entry per confirmed pair: prompt positions after the first, plus
    every token the target has taken since, but not the pending bonus."""
    model, tokenizer, path = target
    drafter = MTPDrafter.for_target(model, path, hidden_state_mode=None)
    prompt = tokenizer.encode(PROMPTS[1])
    cache = model.make_cache()
    logits, hidden = target_forward(model, mx.array([prompt]), cache, mode="post_norm")
    drafter.start(prompt, hidden)
    assert drafter.cached_positions == len(prompt) - 1
    last = int(mx.argmax(logits[0, -1]))
    drafts = drafter.propose(last, 3)
    assert len(drafts) == 3 and drafter.cached_positions == len(prompt) - 1 + 3
    _, verify_hidden = target_forward(model, mx.array([[last, *drafts]]), cache, mode="post_norm")
    drafter.settle([drafts[0], 7], verify_hidden[:, :2])  # one draft accepted, then a bonus
    assert drafter.cached_positions == len(prompt) + 1  # (pending, last) and (hidden of last, d1)
    drafter.stop()
    assert drafter.cached_positions == 0


def test_entering_without_hidden_drafts_nothing_until_a_settle_brings_one(target):
    model, tokenizer, path = target
    drafter = MTPDrafter.for_target(model, path, hidden_state_mode=None)
    drafter.start([1, 2, 3], None)
    assert drafter.propose(4, 3) == []
    drafter.settle([5], mx.zeros((1, 1, 64), dtype=mx.bfloat16))
    assert len(drafter.propose(5, 2)) == 2


def test_the_head_loads_the_checkpoints_mtp_tensors(target):
    _, _, path = target
    config = json.loads((pathlib.Path(path) / "config.json").read_text())
    head = load_mtp_head(path, config)
    stored = mx.load(str(pathlib.Path(path) / "model.safetensors"))
    assert mx.array_equal(head.fc.weight, stored["mtp.fc.weight"]).item()
    assert mx.array_equal(head.layers[0].self_attn.q_proj.weight, stored["mtp.layers.0.self_attn.q_proj.weight"]).item()
