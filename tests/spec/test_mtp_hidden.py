"""hidden_state_mode: post_norm by default, pre_norm honoured (from the model or the config), an unknown value warns
once and uses post_norm; target_forward returns the plain forward's logits with the hidden states of that mode."""

from __future__ import annotations

import json
import logging
import pathlib
import shutil

import mlx.core as mx
import mlx_lm
import pytest

from vllm_mlx_trio.config import config_from_dict
from vllm_mlx_trio.messages import ModelInfo
from vllm_mlx_trio.worker.demo import resolve_demo_model
from vllm_mlx_trio.worker.speculative.hidden import POST_NORM, PRE_NORM, resolve_hidden_state_mode, target_forward
from vllm_mlx_trio.worker.speculative.mtp.drafter import MTPDrafter, load_mtp_drafter

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def demo_dir(demo_cache_dir) -> pathlib.Path:
    return resolve_demo_model("demo:mtp-tiny", demo_cache_dir)


@pytest.fixture(scope="module")
def target(demo_dir):
    model, _ = mlx_lm.load(str(demo_dir))
    return model


def test_resolution_order():
    assert resolve_hidden_state_mode(None, {}) == POST_NORM
    assert resolve_hidden_state_mode(None, {"text_config": {"mtp_hidden_state_mode": "pre_norm"}}) == PRE_NORM
    assert resolve_hidden_state_mode(None, {"mtp_hidden_state_mode": "pre_norm"}) == PRE_NORM
    model_says_pre = {"text_config": {"mtp_hidden_state_mode": "pre_norm"}}
    assert resolve_hidden_state_mode("post_norm", model_says_pre) == POST_NORM  # the config wins
    assert resolve_hidden_state_mode("pre_norm", {}) == PRE_NORM


def test_an_unknown_mode_warns_once_and_uses_post_norm(caplog):
    caplog.set_level(logging.WARNING, logger="vllm_mlx_trio.worker.speculative.hidden")
    model = {"text_config": {"mtp_hidden_state_mode": "mid_norm_test_value"}}
    assert resolve_hidden_state_mode(None, model) == POST_NORM
    assert resolve_hidden_state_mode(None, model) == POST_NORM
    assert resolve_hidden_state_mode("mid_norm_test_value", {}) == POST_NORM
    warnings = [r for r in caplog.records if "mid_norm_test_value" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_target_forward_returns_the_plain_logits_and_the_modes_hidden(target):
    tokens = mx.array([[17, 230, 45, 99]])
    plain = target(tokens, cache=target.make_cache())
    logits, post = target_forward(target, tokens, target.make_cache(), mode=POST_NORM)
    _, pre = target_forward(target, tokens, target.make_cache(), mode=PRE_NORM)
    assert mx.array_equal(logits, plain).item()
    assert post.shape == pre.shape == (1, 4, 64)
    final_norm = target.language_model.model.norm
    assert mx.array_equal(post, final_norm(pre)).item()
    assert not mx.allclose(post, pre).item()
    assert isinstance(target.language_model.model.norm, type(final_norm))  # the tap is gone again
    with pytest.raises(ValueError):
        target_forward(target, tokens, target.make_cache(), mode="mid_norm")


def test_the_drafter_takes_the_models_mode_unless_the_config_overrides(target, demo_dir, tmp_path):
    assert MTPDrafter.for_target(target, demo_dir, hidden_state_mode=None).hidden_state_mode == POST_NORM
    pre_dir = tmp_path / "pre"
    shutil.copytree(demo_dir, pre_dir)
    config = json.loads((pre_dir / "config.json").read_text())
    config["text_config"]["mtp_hidden_state_mode"] = "pre_norm"
    (pre_dir / "config.json").write_text(json.dumps(config))
    assert MTPDrafter.for_target(target, pre_dir, hidden_state_mode=None).hidden_state_mode == PRE_NORM
    assert MTPDrafter.for_target(target, pre_dir, hidden_state_mode="post_norm").hidden_state_mode == POST_NORM


def test_load_mtp_drafter_reads_the_speculative_section(target, demo_dir):
    cfg = config_from_dict(
        {"model": {"path": "demo:mtp-tiny"}, "speculative": {"method": "mtp", "hidden_state_mode": "pre_norm"}}
    )
    info = ModelInfo(
        model_path=str(demo_dir), max_context_tokens=2048, vocab_size=512, eos_token_ids=(2,), tokenizer=None
    )
    drafter = load_mtp_drafter(cfg, target, info)
    assert drafter.needs_target_hidden and drafter.hidden_state_mode == PRE_NORM
