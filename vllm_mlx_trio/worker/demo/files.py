"""The demo models' files: the tokenizer trained on the bundled corpus, and safetensors /
JSON written byte-for-byte reproducibly. Shared by every demo builder (worker/demo/model.py,
worker/demo/spec.py, worker/demo/vlm.py, worker/demo/mtp.py)."""

from __future__ import annotations

import importlib.resources
import json
import pathlib
from typing import Any

import numpy as np

DTYPES = {"float32": "F32", "bfloat16": "BF16"}
#: Integer tensors of quantized layers, stored as they are: packed weights (uint32) and the uint8 scales of MLX's
#: microscaling modes (mxfp4, mxfp8, nvfp4).
PACKED_DTYPES = {np.dtype(np.uint32): "U32", np.dtype(np.uint8): "U8"}

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)


def read_corpus() -> str:
    """The bundled training text for the tokenizer."""
    resource = importlib.resources.files("vllm_mlx_trio") / "data" / "corpus.txt"
    return resource.read_text(encoding="utf-8")


def train_tokenizer(vocab_size: int):
    """Train a byte-level BPE with exactly ``vocab_size`` tokens on the corpus.

    The special tokens get ids 0, 1, 2.  Should the corpus allow fewer merges
    than needed, the vocabulary is padded with ``<|reserved_N|>`` special
    tokens so that the tokenizer and the model always agree on its size.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # all 256 bytes: nothing is unknown
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
    )
    tokenizer.train_from_iterator([read_corpus()], trainer=trainer)
    missing = vocab_size - tokenizer.get_vocab_size()  # the trainer never overshoots
    tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    return tokenizer


def damped_ids(tokenizer) -> list[int]:
    """Ids whose embedding rows get damped: special tokens, and byte tokens
    that on their own decode to no printable text (control characters, partial
    UTF-8 sequences), so that greedy output reads as (random) words."""
    damped = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id])  # special tokens decode to ""
        printable = all(c.isprintable() or c in "\n\t" for c in text)
        if not text or not printable or "\ufffd" in text:
            damped.append(token_id)
    return damped


def to_bfloat16_bytes(array: np.ndarray) -> bytes:
    """Round a contiguous little-endian float32 array to bfloat16 bytes (nearest-even)."""
    bits = array.view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def write_safetensors(path: pathlib.Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """Write ``tensors`` as safetensors by hand: sorted keys, no timestamps. Float tensors are stored in ``dtype``;
    the integer ones of a quantized layer (:data:`PACKED_DTYPES`) as they are."""
    blobs = []
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        array = tensors[name]
        if array.dtype in PACKED_DTYPES:
            little_endian = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
            blob, stored = little_endian.tobytes(), PACKED_DTYPES[array.dtype]
        else:
            f32 = np.ascontiguousarray(array, dtype="<f4")
            blob, stored = (to_bfloat16_bytes(f32) if dtype == "bfloat16" else f32.tobytes()), DTYPES[dtype]
        span = [offset, offset + len(blob)]
        header[name] = {"data_offsets": span, "dtype": stored, "shape": list(array.shape)}
        offset += len(blob)
        blobs.append(blob)
    encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little"))
        f.write(encoded)
        for blob in blobs:
            f.write(blob)


def write_json(path: pathlib.Path, obj: Any) -> None:
    """Write ``obj`` as indented, key-sorted JSON with a trailing newline."""
    text = json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
