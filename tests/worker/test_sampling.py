"""Logits processors and logprobs, exactly, on small hand-made logits."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from vllm_mlx_trio import SamplingParams
from vllm_mlx_trio.worker.sampling import make_request_processors, token_logprobs

pytestmark = pytest.mark.mlx

VOCAB = 8


def run(params: SamplingParams, generated: list[int], prompt=(6, 6, 6), stop_ids=(7,)) -> list[float]:
    """Call the processors as a generator does: once per token, context = prompt + generated."""
    processors = make_request_processors(params, stop_ids=stop_ids)
    context = list(prompt)
    for step in range(len(generated) + 1):
        logits = mx.zeros((1, VOCAB))
        for processor in processors:
            logits = processor(mx.array(context), logits)
        if step < len(generated):
            context.append(generated[step])
    return logits[0].tolist()


def test_presence_and_frequency_penalties_count_generated_tokens_only():
    params = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    logits = run(params, generated=[1, 1, 2])
    assert logits[1] == pytest.approx(-(0.5 + 2 * 0.25))
    assert logits[2] == pytest.approx(-(0.5 + 0.25))
    assert logits[6] == 0.0  # in the prompt only: not penalised (OpenAI semantics)
    assert logits[0] == 0.0


def test_logit_bias_adds_to_the_named_tokens():
    logits = run(SamplingParams(logit_bias=((3, 5.0), (4, -100.0))), generated=[1])
    assert logits[3] == 5.0 and logits[4] == -100.0 and logits[1] == 0.0


def test_min_tokens_bans_stop_ids_until_reached():
    params = SamplingParams(min_tokens=2)
    assert math.isinf(run(params, generated=[])[7])
    assert math.isinf(run(params, generated=[1])[7])
    assert run(params, generated=[1, 1])[7] == 0.0


def test_no_processor_when_nothing_asks_for_one():
    assert make_request_processors(SamplingParams(), stop_ids=(7,)) == []


def test_token_logprobs_reports_the_sampled_token_and_the_top_k_in_order():
    row = mx.log(mx.softmax(mx.array([0.0, 3.0, 1.0, 2.0])))
    [entry] = token_logprobs([row], [2], [3])
    values = row.tolist()
    assert entry.token_id == 2 and entry.logprob == pytest.approx(values[2])
    assert [t for t, _ in entry.top] == [1, 3, 2]
    assert token_logprobs([row], [2], [0])[0].top == ()


def test_token_logprobs_of_many_rows_are_each_rows_own():
    """Rows of mixed shape, dtype and top count, read back together: each entry is its own row's."""
    rows = [mx.log(mx.softmax(mx.array([float((i * 7 + j * 3) % 11) for j in range(VOCAB)]))) for i in range(5)]
    rows[1] = rows[1].astype(mx.bfloat16)
    rows[3] = rows[3][None]  # a (1, vocab) row, as a batch step gives
    chosen = [0, 5, 2, 7, 3]
    num_tops = [3, 0, 2, 3, VOCAB + 4]  # more than the vocabulary: every token, in order
    entries = token_logprobs(rows, chosen, num_tops)
    for row, token, k, entry in zip(rows, chosen, num_tops, entries, strict=True):
        values = row.reshape(-1).astype(mx.float32).tolist()
        best = sorted(range(VOCAB), key=lambda j: -values[j])[:k]
        assert entry.token_id == token and entry.logprob == pytest.approx(values[token])
        assert [t for t, _ in entry.top] == best
        assert [v for _, v in entry.top] == pytest.approx([values[j] for j in best])
    assert token_logprobs([], [], []) == []


def test_byte_level_detokenizer_streams_what_the_tokenizer_decodes(demo_cache_dir):
    """The fast table-driven detokenizer gives the tokenizer's own text, token by token."""
    import random

    from vllm_mlx_trio.config import ModelConfig
    from vllm_mlx_trio.core.text import IncrementalDetokenizer, byte_level_table, make_detokenizer
    from vllm_mlx_trio.worker.loading import load_model

    _model, tokenizer, _config = load_model(ModelConfig(path="demo:tiny", demo_cache_dir=demo_cache_dir))
    table = byte_level_table(tokenizer)
    assert table is not None
    rng = random.Random(0)
    texts = ["héllo ✓ 日本 world", "<|im_start|>user\nWhat is 2+2?<|im_end|>"]
    samples = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    samples += [[rng.randrange(len(table)) for _ in range(40)] for _ in range(50)]
    for ids in samples:
        fast, general = make_detokenizer(tokenizer, table), IncrementalDetokenizer(tokenizer)
        streamed = "".join(fast.add([t]) for t in ids) + fast.flush()
        assert streamed == tokenizer.decode(ids, skip_special_tokens=True)
        assert streamed == "".join(general.add([t]) for t in ids) + general.flush()
