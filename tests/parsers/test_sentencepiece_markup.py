"""Tool markup that a SentencePiece tokenizer has as a special token (Mistral v0.3's ``[TOOL_CALLS]``)
reaches the parser: chat replies are decoded with the parsers' markup kept, other special tokens skipped."""

from __future__ import annotations

import pathlib
from types import SimpleNamespace

import pytest
import sentencepiece as spm
from transformers import LlamaTokenizer

from vllm_mlx_trio.core.text import IncrementalDetokenizer, byte_level_table, keeping_special_markup
from vllm_mlx_trio.engine import _chat_decoder
from vllm_mlx_trio.parsers import OutputParser, markup_strings

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "vllm_mlx_trio" / "data" / "corpus.txt"
REPLY = 'Sure.[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]</s>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A tiny SentencePiece BPE tokenizer as Mistral 7B v0.3's is built: ``[TOOL_CALLS]`` a special token."""
    folder = tmp_path_factory.mktemp("spm")
    spm.SentencePieceTrainer.train(
        input=str(CORPUS),
        model_prefix=str(folder / "tokenizer"),
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    tok = LlamaTokenizer.from_pretrained(folder, legacy=False)
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    assert byte_level_table(tok) is None  # the general detokenizer decodes it
    return tok


def streamed_text(decoder, token_ids: list[int]) -> str:
    detokenizer = IncrementalDetokenizer(decoder)
    return "".join(detokenizer.add([token]) for token in token_ids) + detokenizer.flush()


def test_markup_special_tokens_are_kept_and_the_call_is_parsed(tokenizer):
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids("[TOOL_CALLS]") in ids
    assert "[TOOL_CALLS]" not in streamed_text(tokenizer, ids)  # the plain decode skips it: the bug
    decoder = keeping_special_markup(tokenizer, markup_strings("mistral", None))
    text = streamed_text(decoder, ids)
    assert "[TOOL_CALLS]" in text and "</s>" not in text  # EOS, not markup, is still skipped
    parser = OutputParser(tool_parser="mistral", reasoning_parser=None)
    parser.feed(text)
    parser.finish()
    message = parser.message()
    assert message.content == "Sure."
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Paris"}')]


def test_chat_replies_of_a_tokenizer_without_a_byte_table_keep_the_markup(tokenizer):
    with_markup = SimpleNamespace(markup=markup_strings("mistral", None))
    info = SimpleNamespace(token_bytes=None, tokenizer=tokenizer)
    decoder = _chat_decoder(info, with_markup)
    ids = tokenizer.encode(REPLY, add_special_tokens=False)
    assert decoder.decode(ids) == decoder.decode(ids, skip_special_tokens=True)
    assert "[TOOL_CALLS]" in decoder.decode(ids) and "</s>" in decoder.decode(ids, skip_special_tokens=False)
    assert _chat_decoder(info, SimpleNamespace(markup=frozenset())) is tokenizer
    assert _chat_decoder(SimpleNamespace(token_bytes=(b"",), tokenizer=tokenizer), with_markup) is tokenizer
