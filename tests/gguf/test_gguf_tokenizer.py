"""The tokenizer rebuilt from a GGUF file's metadata encodes, decodes and templates as the model's
own tokenizer.json does; the named pre-tokenizers split as their models' tokenizers do."""

from __future__ import annotations

import json

import pytest
from mlx_lm.utils import load_tokenizer
from tokenizers import Tokenizer, pre_tokenizers

from vllm_mlx_trio.worker.gguf.loader import load_gguf
from vllm_mlx_trio.worker.gguf.tokenizer import tokenizer_files

TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; 1234567 is a number.",
    "line one\nline two\n\n    indented\tand tabbed  \n",
    "it's what they've said, isn't it?",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "café naïve — “quoted”",
    "<|endoftext|>",
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
]


@pytest.fixture(scope="module")
def tokenizer_pair(builds, demo_dir):
    """(the demo's own tokenizer, the one load_gguf rebuilds from the demo's GGUF file)."""
    _, rebuilt, _ = load_gguf(str(builds.gguf("qwen3")), cache_dir=builds.sidecars)
    return load_tokenizer(demo_dir), rebuilt


@pytest.mark.mlx
@pytest.mark.parametrize("text", TEXTS)
def test_rebuilt_tokenizer_encodes_and_decodes_as_the_original(tokenizer_pair, text):
    original, rebuilt = tokenizer_pair
    ids = rebuilt.encode(text)
    assert ids == original.encode(text)
    assert rebuilt.decode(ids) == text


@pytest.mark.mlx
def test_chat_template_and_stop_tokens_come_from_the_metadata(tokenizer_pair):
    original, rebuilt = tokenizer_pair
    for prompt in (True, False):
        text = rebuilt.apply_chat_template(CHAT, add_generation_prompt=prompt, tokenize=False)
        assert text == original.apply_chat_template(CHAT, add_generation_prompt=prompt, tokenize=False)
    ids = rebuilt.apply_chat_template(CHAT, add_generation_prompt=True)
    assert ids == original.apply_chat_template(CHAT, add_generation_prompt=True)
    assert rebuilt.eos_token_ids == {rebuilt.convert_tokens_to_ids("<|im_end|>")}


#: A byte-level BPE small enough to write by hand: the 256 byte symbols, digit merges and a BOS.
BYTE_SYMBOLS = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda symbol: ord(symbol))
MERGES = ["1 2", "12 3", "4 5", "h i"]
BOS = "<s>"


def handmade_metadata(pre: str, **extra) -> dict:
    tokens = [*BYTE_SYMBOLS, "12", "123", "45", "hi", BOS]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * (len(tokens) - 1) + [3],
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": tokens.index(BOS),
        **extra,
    }


def handmade_tokenizer(pre: str, **extra) -> tuple[Tokenizer, dict]:
    tokenizer_json, tokenizer_config = tokenizer_files(handmade_metadata(pre, **extra), max_length=64)
    return Tokenizer.from_str(json.dumps(tokenizer_json)), tokenizer_config


def pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    return tokenizer.encode(text, add_special_tokens=False).tokens


def test_gpt2_keeps_digit_runs_together():
    tokenizer, _ = handmade_tokenizer("gpt-2")
    assert pieces(tokenizer, "12345") == ["123", "45"]
    assert pieces(tokenizer, "2345") == ["2", "3", "45"]


def test_smollm_splits_digits_one_by_one():
    tokenizer, _ = handmade_tokenizer("smollm")
    assert pieces(tokenizer, "12345") == ["1", "2", "3", "4", "5"]
    assert pieces(tokenizer, "hi 12") == ["hi", "Ġ", "1", "2"]


def test_llama_bpe_groups_digits_by_three_and_prepends_bos():
    tokenizer, config = handmade_tokenizer("llama-bpe", **{"tokenizer.ggml.add_bos_token": True})
    assert pieces(tokenizer, "2345") == ["2", "3", "4", "5"]
    assert pieces(tokenizer, "12345") == ["123", "45"]
    assert tokenizer.encode("hi").tokens == [BOS, "hi"]
    assert config["add_bos_token"] is True and config["bos_token"] == BOS


def test_no_bos_without_add_bos_token():
    tokenizer, config = handmade_tokenizer("llama-bpe")
    assert tokenizer.encode("hi").tokens == ["hi"]
    assert config["add_bos_token"] is False
