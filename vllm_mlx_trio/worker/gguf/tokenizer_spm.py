"""A GGUF file's SentencePiece vocabulary (``tokenizer.ggml.model = "llama"``) as a Hugging Face
``tokenizer.json``.

GGUF keeps a SentencePiece BPE model (Llama 2, Mistral 7B, Gemma) as its pieces
(``tokenizer.ggml.tokens``: ``▁`` for a space, ``<0xNN>`` for a byte), one score per piece
(``tokenizer.ggml.scores``) and one type per piece (``tokenizer.ggml.token_type``). llama.cpp
tokenizes each stretch of text between special tokens on its own: a space put in front of it
(unless ``tokenizer.ggml.add_space_prefix`` is false), every space written as ``▁``, then adjacent
pieces merged best score first, and a character the vocabulary lacks spelled as its UTF-8 bytes.

The tokenizer.json below does the same, in the layout of transformers' ``LlamaConverter`` in its
legacy mode (``GemmaConverter`` without the prefix): a BPE model with byte fallback whose merges are
every pair of pieces that make up a longer piece, ranked by that piece's score (what SentencePiece's
own BPE encoder merges by); a normalizer that prepends ``▁`` to each stretch of text and writes
spaces as ``▁``; unknown, control and user-defined pieces matched whole in the raw text; a decoder
that undoes it all (the sequence mlx-lm matches to pick its SentencePiece streaming detokenizer).
The prefix is a normalizer, not transformers' ``Metaspace`` pre-tokenizer: Metaspace adds none to a
stretch that already starts with a space, where SentencePiece and llama.cpp do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: GGUF token types (llama.cpp's ``llama_token_type``, SentencePiece's piece types).
NORMAL = 1
UNKNOWN = 2
CONTROL = 3
USER_DEFINED = 4
UNUSED = 5
BYTE = 6

#: SentencePiece's visible space.
SPACE = "\u2581"

#: Piece types matched whole in the raw text before the BPE model sees it.
_ADDED_TYPES = (UNKNOWN, CONTROL, USER_DEFINED)


def spm_tokenizer_json(metadata: Mapping[str, Any], *, add_bos: bool, add_eos: bool) -> dict[str, Any]:
    """The ``tokenizer.json`` of the file's SentencePiece BPE vocabulary, BOS / EOS put around each
    sequence as ``add_bos`` / ``add_eos`` say; ``KeyError`` naming what the vocabulary lacks."""
    tokens, scores, types = _vocabulary(metadata)
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    bos = _special(metadata, tokens, "bos") if add_bos else None
    eos = _special(metadata, tokens, "eos") if add_eos else None
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added_tokens(tokens, types),
        "normalizer": _normalizer(space_prefix),
        "pre_tokenizer": None,
        "post_processor": _template(bos, eos),
        "decoder": _decoder(space_prefix),
        "model": _bpe_model(tokens, scores, types, _unknown(metadata, tokens, types)),
    }


def _vocabulary(metadata: Mapping[str, Any]) -> tuple[list[str], list[float], list[int]]:
    """(pieces, scores, types), checked to be a SentencePiece BPE vocabulary."""
    tokens: list[str] = list(metadata.get("tokenizer.ggml.tokens") or [])
    scores = metadata.get("tokenizer.ggml.scores")
    types = metadata.get("tokenizer.ggml.token_type")
    if not tokens:
        raise KeyError("SentencePiece tokenizer ('llama') has no tokenizer.ggml.tokens")
    if scores is None:
        raise KeyError(
            "SentencePiece tokenizer ('llama') has no tokenizer.ggml.scores: "
            "its BPE merges are ranked by the piece scores and cannot be rebuilt"
        )
    if types is None:
        raise KeyError("SentencePiece tokenizer ('llama') has no tokenizer.ggml.token_type")
    if not len(tokens) == len(scores) == len(types):
        raise KeyError(
            f"SentencePiece tokenizer ('llama') has {len(tokens)} tokens, {len(scores)} scores "
            f"and {len(types)} token types"
        )
    return tokens, [float(score) for score in scores], [int(kind) for kind in types]


def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[list[str]]:
    """Every (left, right) pair of normal pieces that make up a normal piece, the pieces with the
    best score first (SentencePiece's BPE encoder merges the adjacent pair whose joined piece scores
    best), a piece's own splits shortest left part first (as transformers orders them)."""
    normal = {token: index for index, token in enumerate(tokens) if types[index] == NORMAL}
    ranked = []
    for token, index in normal.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in normal and right in normal:
                ranked.append((-scores[index], index, cut, left, right))
    ranked.sort(key=lambda merge: merge[:3])
    return [[left, right] for *_, left, right in ranked]


def _bpe_model(tokens: list[str], scores: list[float], types: list[int], unk: str | None) -> dict[str, Any]:
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": unk,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": True,
        "byte_fallback": True,
        "ignore_merges": False,
        "vocab": {token: index for index, token in enumerate(tokens)},  # a repeated piece: its last id, as llama.cpp
        "merges": spm_merges(tokens, scores, types),
    }


def _added_tokens(tokens: list[str], types: list[int]) -> list[dict[str, Any]]:
    """Unknown, control and user-defined pieces, matched in the raw text (as llama.cpp splits them
    off before tokenizing); only user-defined ones are not special (kept by a decode that skips
    special tokens)."""
    return [
        added_token(index, tokens[index], normalized=False, special=kind != USER_DEFINED)
        for index, kind in enumerate(types)
        if kind in _ADDED_TYPES
    ]


def added_token(index: int, content: str, *, normalized: bool, special: bool) -> dict[str, Any]:
    """One entry of tokenizer.json's ``added_tokens``: matched whole, as written."""
    return {
        "id": index,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": normalized,
        "special": special,
    }


def _normalizer(space_prefix: bool) -> dict[str, Any]:
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    if not space_prefix:
        return replace
    return {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, replace]}


def _decoder(space_prefix: bool) -> dict[str, Any]:
    """``▁`` back to spaces, byte pieces back to UTF-8, and the prepended space dropped: the exact
    sequences mlx-lm's ``load_tokenizer`` matches to pick its SentencePiece streaming detokenizer."""
    steps: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
        {"type": "ByteFallback"},
        {"type": "Fuse"},
    ]
    if space_prefix:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def _template(bos: tuple[str, int] | None, eos: tuple[str, int] | None) -> dict[str, Any] | None:
    """``<bos> $A <eos>`` (pair: ``<bos> $A <eos> <bos> $B <eos>``) with the parts asked for, as
    transformers' ``update_post_processor`` builds it."""
    if bos is None and eos is None:
        return None

    def sequence(part: str, type_id: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = [{"Sequence": {"id": part, "type_id": type_id}}]
        if bos is not None:
            items.insert(0, {"SpecialToken": {"id": bos[0], "type_id": type_id}})
        if eos is not None:
            items.append({"SpecialToken": {"id": eos[0], "type_id": type_id}})
        return items

    specials = [special for special in (bos, eos) if special is not None]
    return {
        "type": "TemplateProcessing",
        "single": sequence("A", 0),
        "pair": sequence("A", 0) + sequence("B", 1),
        "special_tokens": {token: {"id": token, "ids": [index], "tokens": [token]} for token, index in specials},
    }


def _special(metadata: Mapping[str, Any], tokens: list[str], role: str) -> tuple[str, int] | None:
    index = metadata.get(f"tokenizer.ggml.{role}_token_id")
    if index is None or not 0 <= int(index) < len(tokens):
        return None
    return tokens[int(index)], int(index)


def _unknown(metadata: Mapping[str, Any], tokens: list[str], types: list[int]) -> str | None:
    """The unknown piece: the one the metadata names, else the one typed unknown, else none (byte
    fallback spells every character the vocabulary lacks)."""
    named = _special(metadata, tokens, "unknown")
    if named is not None:
        return named[0]
    return next((tokens[index] for index, kind in enumerate(types) if kind == UNKNOWN), None)
