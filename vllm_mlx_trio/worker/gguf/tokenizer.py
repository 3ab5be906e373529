"""A GGUF file's tokenizer as Hugging Face ``tokenizer.json`` / ``tokenizer_config.json``.

GGUF keeps a byte-level BPE tokenizer (``tokenizer.ggml.model = "gpt2"``) as its vocabulary,
merges, token types and a named pre-tokenizer (``tokenizer.ggml.pre``); each name below is the
split the model's own ``tokenizer.json`` does, so the rebuilt tokenizer encodes exactly as the
original. SentencePiece BPE vocabularies (``"llama"``: Llama 2, Mistral 7B, Gemma) are rebuilt by
tokenizer_spm.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .tokenizer_spm import added_token, spm_tokenizer_json

#: GGUF token types (llama.cpp's ``llama_token_type``) that are added tokens, not BPE pieces.
CONTROL = 3
USER_DEFINED = 4

#: tokenizer_config.json's special-token keys -> GGUF's ``tokenizer.ggml.<role>_token_id``.
_SPECIAL_ROLES = {"bos": "bos", "eos": "eos", "unk": "unknown", "pad": "padding"}

#: Qwen2/Qwen3's split: one digit at a time, letters with one leading non-letter.
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Llama 3's split: as Qwen2's, with up to three digits together.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level(*, use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split(pattern: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _sequence(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Sequence", "pretokenizers": list(steps)}


#: ``tokenizer.ggml.pre`` -> (normalizer, pre-tokenizer) of the model's tokenizer.json.
PRE_TOKENIZERS: Mapping[str, tuple[dict[str, Any] | None, dict[str, Any]]] = {
    "default": (None, _byte_level(use_regex=True)),
    "gpt-2": (None, _byte_level(use_regex=True)),
    "smollm": (None, _sequence({"type": "Digits", "individual_digits": True}, _byte_level(use_regex=True))),
    "qwen2": ({"type": "NFC"}, _sequence(_split(_QWEN2_SPLIT), _byte_level(use_regex=False))),
    "llama-bpe": (None, _sequence(_split(_LLAMA3_SPLIT), _byte_level(use_regex=False))),
}


def tokenizer_files(metadata: Mapping[str, Any], *, max_length: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) for the file's tokenizer; ``KeyError`` naming
    what is not supported."""
    model = metadata.get("tokenizer.ggml.model")
    if model == "llama":
        return _spm_files(metadata, max_length=max_length)
    if model != "gpt2":
        raise KeyError(
            f"tokenizer model {model!r} is not supported (supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)"
        )
    pre = str(metadata.get("tokenizer.ggml.pre", "default"))
    if pre not in PRE_TOKENIZERS:
        raise KeyError(f"pre-tokenizer {pre!r} is not mapped (supported: {', '.join(PRE_TOKENIZERS)})")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    normalizer, pre_tokenizer = PRE_TOKENIZERS[pre]
    bos = _token(metadata, tokens, "bos")
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": _bos_template(bos, tokens.index(bos)) if add_bos else _byte_level(use_regex=True),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": _bpe_model(tokens, metadata.get("tokenizer.ggml.merges") or []),
    }
    return tokenizer_json, _tokenizer_config(metadata, tokens, add_bos=add_bos, max_length=max_length)


def _spm_files(metadata: Mapping[str, Any], *, max_length: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A SentencePiece vocabulary's files; BOS is added unless the file says not to (llama.cpp's
    default for these vocabularies), EOS only where it says to."""
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", True)) and _token(metadata, tokens, "bos") is not None
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False)) and _token(metadata, tokens, "eos") is not None
    tokenizer_json = spm_tokenizer_json(metadata, add_bos=add_bos, add_eos=add_eos)
    config = _tokenizer_config(metadata, tokens, add_bos=add_bos, max_length=max_length)
    return tokenizer_json, {**config, "add_eos_token": add_eos}


def _bpe_model(tokens: list[str], merges: list[str]) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": {token: index for index, token in enumerate(tokens)},
        "merges": [merge.split(" ", 1) for merge in merges],
    }


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    return [
        added_token(index, tokens[index], normalized=kind != CONTROL, special=kind == CONTROL)
        for index, kind in enumerate(types)
        if kind in (CONTROL, USER_DEFINED)
    ]


def _bos_template(bos: str, bos_id: int) -> dict[str, Any]:
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _token(metadata: Mapping[str, Any], tokens: list[str], role: str) -> str | None:
    index = metadata.get(f"tokenizer.ggml.{role}_token_id")
    return tokens[int(index)] if index is not None and 0 <= int(index) < len(tokens) else None


def _tokenizer_config(
    metadata: Mapping[str, Any], tokens: list[str], *, add_bos: bool, max_length: int
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
    }
    for role, gguf_role in _SPECIAL_ROLES.items():
        token = _token(metadata, tokens, gguf_role)
        if token is not None:
            config[f"{role}_token"] = token
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = str(metadata["tokenizer.chat_template"])
    return config
