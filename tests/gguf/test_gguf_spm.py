"""SentencePiece GGUF vocabularies (``tokenizer.ggml.model = "llama"``) rebuilt as tokenizer.json
encode as the model's own SentencePiece model does, the way llama.cpp runs it.

Two tiny SentencePiece BPE models are trained on the project's corpus: one as Llama 2's is made
(a space put in front of the text, ``<unk>``/``<s>``/``</s>`` at ids 0-2) and one as Gemma's
(no space in front, digits split, ``<pad>``/``<eos>``/``<bos>``/``<unk>`` at ids 0-3), each with
byte fallback and user-defined pieces. Each is written into a GGUF file as llama.cpp's
convert_hf_to_gguf.py writes one (``_create_vocab_sentencepiece`` and gguf-py's ``SpecialVocab``),
read back, and rebuilt by ``tokenizer_files``. The references:

* SentencePiece's own ``encode``, run as llama.cpp runs it: special and user-defined pieces split
  off the raw text first, each stretch between them encoded on its own (so each gets the dummy
  prefix). On text without those pieces that is plain ``SentencePieceProcessor.encode``.
* transformers' converter from the ``tokenizer.model`` (``LlamaTokenizer`` in legacy mode,
  ``GemmaTokenizer``): the same vocabulary, merges and decoder, and the same ids wherever its
  ``Metaspace`` pre-tokenizer agrees with SentencePiece (it adds no dummy prefix to a stretch that
  already starts with a space; SentencePiece and llama.cpp do).
"""

from __future__ import annotations

import json
import pathlib
import re

import gguf
import pytest
import sentencepiece as spm
from gguf_builders import demo_gguf_parts, write_gguf
from transformers import AutoTokenizer, GemmaTokenizer, LlamaTokenizer

from vllm_mlx_trio.worker.gguf import read_header
from vllm_mlx_trio.worker.gguf.tokenizer import tokenizer_files
from vllm_mlx_trio.worker.gguf.tokenizer_spm import BYTE, CONTROL, NORMAL, UNKNOWN, UNUSED, USER_DEFINED

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "vllm_mlx_trio" / "data" / "corpus.txt"
#: The tiny demo model's vocabulary size: the end-to-end file pairs this vocabulary with its weights.
VOCAB_SIZE = 512
CHATML = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
STYLES = {
    "llama": {
        "trainer": {"add_dummy_prefix": True, "unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1},
        "user_defined": ["<|im_start|>", "<|im_end|>", "<tool>"],
        "control": [],
    },
    "gemma": {
        "trainer": {
            "add_dummy_prefix": False,
            "split_digits": True,
            "pad_id": 0,
            "eos_id": 1,
            "bos_id": 2,
            "unk_id": 3,
            "pad_piece": "<pad>",
            "eos_piece": "<eos>",
            "bos_piece": "<bos>",
        },
        "user_defined": ["<|im_start|>", "<|im_end|>", "<tool>"],
        "control": ["<mask>"],
    },
}
TEXTS = [
    "Hello, world!",
    "The kettle ticks as it warms, and the cat waits by her bowl.",
    " leading space",
    "  two leading spaces and  double  spaces inside",
    "trailing spaces  ",
    "line one\nline two\n\n\tindented\n",
    "The year 2024 had 366 days; 1234567 is a number.",
    "café naïve — “quoted” 中文 emoji 😀🍞",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "a <tool> b<tool>c",
    "before</s>after <s> between",
    "<|im_start|> space after a special piece",
    "",
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And café?"},
]


class Vocabulary:
    """One trained SentencePiece model, its transformers tokenizer, its GGUF metadata and the
    tokenizer rebuilt from that metadata."""

    def __init__(self, root: pathlib.Path, style: str) -> None:
        self.style = style
        self.folder = root / f"hf-{style}"
        self.folder.mkdir(parents=True)
        self.sp = train(self.folder / "tokenizer.model", style)
        self.reference = reference_tokenizer(self.folder, style)
        self.metadata = converted_metadata(self.folder, root / f"vocab-{style}.gguf", style)
        self.rebuilt_dir = root / f"rebuilt-{style}"
        write_tokenizer(self.rebuilt_dir, self.metadata)
        self.rebuilt = AutoTokenizer.from_pretrained(self.rebuilt_dir)
        #: Pieces llama.cpp splits off the raw text: unknown, control and user-defined ones.
        self.added = [
            self.sp.id_to_piece(index)
            for index in range(self.sp.get_piece_size())
            if self.sp.is_unknown(index)
            or self.sp.is_control(index)
            or self.sp.id_to_piece(index) in STYLES[style]["user_defined"]
        ]

    def llama_cpp_ids(self, text: str) -> list[int]:
        """``text`` as llama.cpp tokenizes it with this model: added pieces split off, each stretch
        between them encoded by SentencePiece on its own."""
        pattern = "|".join(re.escape(piece) for piece in sorted(self.added, key=len, reverse=True))
        ids: list[int] = []
        for part in re.split(f"({pattern})", text):
            if part in self.added:
                ids.append(self.sp.piece_to_id(part))
            elif part:
                ids += self.sp.encode(part)
        return ids


def train(path: pathlib.Path, style: str) -> spm.SentencePieceProcessor:
    """A SentencePiece BPE model of ``style`` (Llama's normalizer settings: no NFKC, spaces kept)."""
    spec = STYLES[style]
    spm.SentencePieceTrainer.train(
        input=str(CORPUS),
        model_prefix=str(path.with_suffix("")),
        vocab_size=VOCAB_SIZE,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        user_defined_symbols=spec["user_defined"],
        control_symbols=spec["control"],
        num_threads=1,
        minloglevel=2,
        **spec["trainer"],
    )
    return spm.SentencePieceProcessor(model_file=str(path))


def reference_tokenizer(folder: pathlib.Path, style: str):
    """transformers' tokenizer converted from ``folder/tokenizer.model``, saved into ``folder`` with
    a tokenizer_config.json as a Hugging Face checkpoint has it (``added_tokens_decoder``, BOS)."""
    cls = LlamaTokenizer if style == "llama" else GemmaTokenizer
    options = {"legacy": True} if style == "llama" else {}
    tokenizer = cls.from_pretrained(folder, add_bos_token=True, add_eos_token=False, **options)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["added_tokens_decoder"] = {
        str(index): {"content": token.content, "special": token.special, "normalized": token.normalized}
        for index, token in tokenizer.added_tokens_decoder.items()
    }
    config.update(add_bos_token=True, add_eos_token=False, chat_template=CHATML)
    config_path.write_text(json.dumps(config))
    return tokenizer


def converted_metadata(folder: pathlib.Path, path: pathlib.Path, style: str) -> dict:
    """The ``tokenizer.*`` keys convert_hf_to_gguf.py writes for ``folder`` (``_set_vocab_sentencepiece``,
    and Gemma's ``add_space_prefix = False``), written to a vocabulary-only GGUF file and read back."""
    tokens, scores, types = sentencepiece_vocab(folder)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    if style == "gemma":
        writer.add_add_space_prefix(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {key: value for key, value in read_header(path).metadata.items() if key.startswith("tokenizer.")}


def sentencepiece_vocab(folder: pathlib.Path) -> tuple[list[str], list[float], list[int]]:
    """convert_hf_to_gguf.py's ``_create_vocab_sentencepiece``: each piece, score and type from the
    model, then the tokenizer_config's added tokens as control (special, or looking special) or
    user-defined pieces scored -1000."""
    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tokens, scores, types = [], [], []
    for index in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(index))
        scores.append(sp.get_score(index))
        types.append(piece_type(sp, index))
    added = json.loads((folder / "tokenizer_config.json").read_text()).get("added_tokens_decoder", {})
    for key, data in added.items():
        index, token = int(key), data["content"]
        if index >= len(tokens):
            continue
        if data.get("special") or looks_special(token):
            types[index] = CONTROL
        else:
            token = token.replace("\u2581", " ")
            types[index] = USER_DEFINED
        scores[index] = -1000.0
        tokens[index] = token
    return tokens, scores, types


def piece_type(sp: spm.SentencePieceProcessor, index: int) -> int:
    if sp.is_unknown(index):
        return UNKNOWN
    if sp.is_control(index):
        return CONTROL
    if sp.is_unused(index):
        return UNUSED
    return BYTE if sp.is_byte(index) else NORMAL


def looks_special(token: str) -> bool:
    """convert_hf_to_gguf.py's ``does_token_look_special`` (the cases these vocabularies can hit)."""
    return token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (token.startswith("<|") and token.endswith("|>"))


def write_tokenizer(folder: pathlib.Path, metadata: dict) -> None:
    tokenizer_json, tokenizer_config = tokenizer_files(metadata, max_length=256)
    folder.mkdir(parents=True)
    for name, content in (("tokenizer.json", tokenizer_json), ("tokenizer_config.json", tokenizer_config)):
        (folder / name).write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="module", params=list(STYLES))
def vocab(request, tmp_path_factory) -> Vocabulary:
    return Vocabulary(tmp_path_factory.mktemp("spm"), request.param)


def starts_stretch_with_space(vocabulary: Vocabulary, text: str) -> bool:
    """Whether a stretch of ``text`` between added pieces starts with a space (where transformers'
    Metaspace pre-tokenizer skips the dummy prefix that SentencePiece adds)."""
    pattern = "|".join(re.escape(piece) for piece in vocabulary.added)
    return any(part.startswith(" ") for part in re.split(pattern, text))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_sentencepieces_as_llama_cpp_runs_it(vocab, text):
    ids = vocab.rebuilt.encode(text, add_special_tokens=False)
    assert ids == vocab.llama_cpp_ids(text)
    if not any(piece in text for piece in vocab.added):
        assert ids == vocab.sp.encode(text)


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_transformers_where_its_metaspace_agrees(vocab, text):
    prefixed = STYLES[vocab.style]["trainer"]["add_dummy_prefix"]
    if prefixed and starts_stretch_with_space(vocab, text):
        pytest.skip("transformers' Metaspace adds no dummy prefix before a space; SentencePiece does")
    assert vocab.rebuilt.encode(text) == vocab.reference.encode(text)


def test_vocabulary_merges_and_decoder_are_transformers(vocab):
    rebuilt = json.loads((vocab.rebuilt_dir / "tokenizer.json").read_text())
    reference = json.loads(vocab.reference.backend_tokenizer.to_str())
    reference_vocab = {token: index for token, index in reference["model"]["vocab"].items() if index < VOCAB_SIZE}
    assert rebuilt["model"]["vocab"] == reference_vocab
    assert rebuilt["model"]["merges"] == reference["model"]["merges"]
    assert rebuilt["decoder"] == reference["decoder"]
    assert rebuilt["model"]["byte_fallback"] is reference["model"]["byte_fallback"] is True
    assert rebuilt["model"]["fuse_unk"] is reference["model"]["fuse_unk"] is True
    assert rebuilt["model"]["unk_token"] == "<unk>"  # transformers' LlamaTokenizer leaves it unset


@pytest.mark.parametrize("text", [text for text in TEXTS if "<" not in text])
def test_decode_round_trips(vocab, text):
    ids = vocab.rebuilt.encode(text)
    assert vocab.rebuilt.decode(ids, skip_special_tokens=True) == text == vocab.sp.decode(ids)


def test_bos_and_chat_template_come_from_the_metadata(vocab):
    bos = vocab.sp.bos_id()
    assert vocab.metadata["tokenizer.ggml.add_bos_token"] is True
    assert vocab.rebuilt.encode("hi") == [bos, *vocab.llama_cpp_ids("hi")]
    text = vocab.rebuilt.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text == vocab.reference.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.mlx
@pytest.mark.parametrize("text", TEXTS)
def test_streamed_detokenization_equals_the_full_decode(vocab, text):
    from mlx_lm.tokenizer_utils import SPMStreamingDetokenizer
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(vocab.rebuilt_dir)
    detokenizer = tokenizer.detokenizer
    assert isinstance(detokenizer, SPMStreamingDetokenizer)
    assert detokenizer.trim_space is STYLES[vocab.style]["trainer"]["add_dummy_prefix"]
    ids = tokenizer.encode(text)
    detokenizer.reset()
    for token in ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    assert detokenizer.text == tokenizer.decode(ids)


def test_vocabulary_without_scores_is_refused(vocab):
    metadata = {key: value for key, value in vocab.metadata.items() if key != "tokenizer.ggml.scores"}
    with pytest.raises(KeyError, match=r"SentencePiece tokenizer \('llama'\) has no tokenizer.ggml.scores"):
        tokenizer_files(metadata, max_length=64)


@pytest.mark.mlx
def test_llama_file_with_a_sentencepiece_vocabulary_loads_and_chats(demo_dir, tmp_path, tmp_path_factory):
    from vllm_mlx_trio.worker.gguf.loader import load_gguf

    vocab = Vocabulary(tmp_path_factory.mktemp("spm-e2e"), "llama")
    metadata, tensors = demo_gguf_parts(demo_dir, "llama")
    assert metadata["llama.vocab_size"] == VOCAB_SIZE
    metadata = {key: value for key, value in metadata.items() if not key.startswith("tokenizer.")}
    path = write_gguf(tmp_path / "llama-spm.gguf", {**metadata, **vocab.metadata}, tensors)
    model, tokenizer, config = load_gguf(str(path), cache_dir=tmp_path / "sidecars")
    assert config["eos_token_id"] == [vocab.sp.eos_id()]
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True)
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<s><|im_start|>system\nBe brief.<|im_end|>\n")
    assert ids == vocab.llama_cpp_ids(text)
    import mlx.core as mx

    logits = model(mx.array([ids]))
    assert logits.shape == (1, len(ids), VOCAB_SIZE)


@pytest.mark.parametrize(
    ("flags", "bos", "eos"),
    [({}, True, False), ({"add_bos_token": False}, False, False), ({"add_eos_token": True}, True, True)],
    ids=["default", "no-bos", "eos"],
)
def test_bos_and_eos_follow_llama_cpps_defaults(vocab, tmp_path, flags, bos, eos):
    """Without ``add_bos_token`` a SentencePiece file gets BOS (llama.cpp's default), EOS only when asked."""
    metadata = {key: value for key, value in vocab.metadata.items() if not key.startswith("tokenizer.ggml.add_")}
    metadata.update({f"tokenizer.ggml.{key}": value for key, value in flags.items()})
    metadata["tokenizer.ggml.add_space_prefix"] = vocab.metadata.get("tokenizer.ggml.add_space_prefix", True)
    write_tokenizer(tmp_path / "tok", metadata)
    ids = AutoTokenizer.from_pretrained(tmp_path / "tok").encode("hi")
    assert ids == [vocab.sp.bos_id()] * bos + vocab.llama_cpp_ids("hi") + [vocab.sp.eos_id()] * eos
