"""The grammar mask on the MLX side: bit layout, stepping a matcher, stop ids at the end,
and a resumed row replaying its tokens."""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np
import pytest

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.core.constraint import ConstraintSpec
from vllm_mlx_trio.structured import ConstraintCompiler
from vllm_mlx_trio.worker.grammar_mask import GrammarViolation, apply_bitmask, grammar_processor
from vllm_mlx_trio.worker.sampling import make_request_processors

pytestmark = pytest.mark.mlx

STOP = (2, 300)  # EOS and a stop_token_id
EOS = [0, 2]  # the llguidance tokenizer's (tests/structured/conftest.py)
PROMPT = mx.array([5, 6, 7])


def allowed(logits: mx.array) -> list[int]:
    return np.nonzero(np.array(logits[0].astype(mx.float32)) > -np.inf)[0].tolist()


@pytest.mark.parametrize("vocab", [96, 100, 140])
def test_bits_select_tokens_and_padding_past_the_mask_is_disallowed(vocab):
    words = np.zeros(3, dtype=np.uint32)
    words[0], words[2] = 0b101, 1 << 31  # tokens 0, 2 and 95
    assert allowed(apply_bitmask(mx.zeros((1, vocab), dtype=mx.bfloat16), words)) == [0, 2, 95]


@pytest.fixture
def choice(llg_tokenizer):
    compiler = ConstraintCompiler(lambda: llg_tokenizer)
    return compiler.compile(ConstraintSpec(kind="choice", body='["yes", "no"]')), llg_tokenizer


def run(processor, tokens: list[int], vocab: int) -> list[list[int]]:
    """Call as a generator does: first with the prompt, then once per sampled token."""
    masks, context = [], PROMPT
    for step in range(len(tokens) + 1):
        masks.append(allowed(processor(context, mx.zeros((1, vocab)))))
        if step < len(tokens):
            context = mx.concatenate([context, mx.array([tokens[step]])])
    return masks


def test_the_mask_follows_the_grammar_then_allows_only_the_stop_ids(choice):
    compiled, tokenizer = choice
    yes = tokenizer.tokenize_str("yes")
    masks = run(grammar_processor(compiled, stop_ids=STOP), yes, tokenizer.vocab_size)
    assert yes[0] in masks[0]
    assert all(
        "yes".startswith(tokenizer.decode_str([t])) or "no".startswith(tokenizer.decode_str([t])) for t in masks[0]
    )
    assert masks[-1] == sorted({*EOS, *STOP})  # the grammar is complete: only EOS and the request's stop ids
    assert 300 not in masks[0]


def test_a_resumed_row_replays_its_tokens(choice):
    compiled, tokenizer = choice
    yes = tokenizer.tokenize_str("yes")
    stepped = run(grammar_processor(compiled, stop_ids=STOP), yes, tokenizer.vocab_size)
    resumed = run(grammar_processor(compiled, stop_ids=STOP, generated=tuple(yes)), [], tokenizer.vocab_size)
    assert resumed == stepped[-1:]


def test_a_token_outside_the_grammar_fails_the_row(choice):
    compiled, tokenizer = choice
    processor = grammar_processor(compiled, stop_ids=STOP)
    processor(PROMPT, mx.zeros((1, tokenizer.vocab_size)))
    bad = tokenizer.tokenize_str("maybe")[0]
    with pytest.raises(GrammarViolation):
        processor(mx.concatenate([PROMPT, mx.array([bad])]), mx.zeros((1, tokenizer.vocab_size)))


def test_the_constraint_is_the_last_processor(choice):
    compiled, tokenizer = choice
    params = SamplingParams(logit_bias=((3, 100.0),), constraint=compiled.spec, grammar=compiled)
    processors = make_request_processors(params, stop_ids=STOP)
    logits = mx.zeros((1, tokenizer.vocab_size))
    for processor in processors:
        logits = processor(PROMPT, logits)
    assert 3 not in allowed(logits)  # the bias cannot lift a token the grammar forbids


def test_a_complete_grammar_ends_the_row_even_before_min_tokens(choice):
    compiled, tokenizer = choice
    params = SamplingParams(min_tokens=50, constraint=compiled.spec, grammar=compiled)
    processors = make_request_processors(params, stop_ids=STOP)
    context, yes = PROMPT, tokenizer.tokenize_str("yes")
    for step in range(len(yes) + 1):
        logits = mx.zeros((1, tokenizer.vocab_size))
        for processor in processors:
            logits = processor(context, logits)
        if step < len(yes):
            context = mx.concatenate([context, mx.array([yes[step]])])
    assert allowed(logits) == sorted({*EOS, *STOP})


def test_an_uncompiled_constraint_fails_its_row_only():
    params = SamplingParams(constraint=ConstraintSpec(kind="regex", body="a+"))
    (processor,) = make_request_processors(params, stop_ids=STOP)
    with pytest.raises(RuntimeError, match="not compiled"):
        processor(PROMPT, mx.zeros((1, 8)))
    assert attrs.evolve(params, grammar=None) == params
