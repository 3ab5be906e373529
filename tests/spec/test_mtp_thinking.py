"""The thinking gate on token ids: a thinking request stays off speculation; with the opt-in it comes back once its
block has closed (and leaves again when another opens); markers may straddle two steps' tokens."""

from __future__ import annotations

import types

import pytest

from vllm_mlx_trio.config import load_config
from vllm_mlx_trio.worker.speculative.mtp.thinking import (
    RESUME_ENV,
    Phase,
    ThinkingGate,
    ThinkingMarkers,
    resume_enabled,
)

START, END = (901, 902), (903, 902)  # two-token markers sharing a token, like BPE pieces of <think> / </think>
WORDS = {901: "<th", 902: "ink>", 903: "</th"}


def decode(ids: list[int]) -> str:
    return "".join(WORDS.get(i, f" w{i}") for i in ids)


def gate(resume: bool) -> ThinkingGate:
    return ThinkingGate(ThinkingMarkers(START, END, "<think>"), resume=resume, decode=decode)


@pytest.mark.parametrize("resume", [False, True])
def test_a_reply_without_a_block_may_speculate(resume):
    g, seq = gate(resume), object()
    assert g.allows(seq, [1, 2, 3], [4, 5]) and g.phase is Phase.NONE


@pytest.mark.parametrize("resume", [False, True])
def test_a_prompt_that_opened_the_block_keeps_the_request_off_until_it_closes(resume):
    g, seq = gate(resume), object()
    prompt = [1, 2, *START]
    assert not g.allows(seq, prompt, [4, 5])
    assert g.phase is Phase.THINKING
    assert g.allows(seq, prompt, [4, 5, *END, 6]) is resume
    assert g.phase is Phase.ENDED


def test_the_block_opened_in_the_output_and_markers_straddling_steps():
    g, seq = gate(True), object()
    out = [4, START[0]]
    assert g.allows(seq, [1], out)  # half a marker: still no block
    out += [START[1], 7, END[0]]
    assert not g.allows(seq, [1], out) and g.phase is Phase.THINKING
    out += [END[1], 8]
    assert g.allows(seq, [1], out) and g.phase is Phase.ENDED
    out += [*START, 9]
    assert not g.allows(seq, [1], out) and g.phase is Phase.THINKING  # a new block: off again


def test_another_sequence_starts_afresh():
    g = gate(False)
    first, second = object(), object()
    assert not g.allows(first, [*START], [5])
    assert g.allows(second, [1], [5])  # same request id or not: a new sequence object is scanned anew


def test_the_opt_in_from_the_config_or_the_seeds_environment_variable():
    off = load_config(None, overrides=[], environ={})
    on = load_config(None, overrides=["speculative.thinking_retirement_resume=true"], environ={})
    assert not resume_enabled(off, environ={}) and resume_enabled(on, environ={})
    assert resume_enabled(off, environ={RESUME_ENV: "1"})
    assert not resume_enabled(off, environ={RESUME_ENV: "0"})


def test_markers_come_from_the_reasoning_parser():
    tokenizer = types.SimpleNamespace(chat_template=None, encode=lambda text, add_special_tokens: [len(text)])
    model = types.SimpleNamespace(reasoning_parser="qwen3")
    assert ThinkingMarkers.for_model(model, tokenizer) == ThinkingMarkers((7,), (8,), "<think>")
    assert ThinkingMarkers.for_model(types.SimpleNamespace(reasoning_parser="none"), tokenizer) is None
