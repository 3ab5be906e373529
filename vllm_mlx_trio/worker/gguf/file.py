"""A GGUF file's header, read and checked before MLX touches its tensors.

``mx.load`` reads a GGUF's tensors, but it casts every tensor type it cannot keep packed to
float16, and it trusts the header's offsets. So the header is read first (llama.cpp's own
``gguf`` reader, made to stop at the end of the file): a truncated file, a file that is not
GGUF, and tensor types MLX does not keep in its quantized layout are refused here with the path
and what is wrong.
"""

from __future__ import annotations

import collections
import os
import pathlib
from typing import Any

import attrs
import numpy as np
from gguf import GGUFReader

from ...errors import ModelLoadError

GGUF_SUFFIX = ".gguf"

#: Tensor types kept as they are stored: plain floats (BF16 read past ``mx.load``, weights.py),
#: and the three block formats that map one to one onto MLX's affine quantization (group size 32).
NATIVE_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"})
#: The quantized ones among them, and the bits MLX packs each in.
QUANTIZED_BITS = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}


@attrs.frozen
class GGUFHeader:
    """What a GGUF file says about itself, as plain Python values."""

    path: pathlib.Path
    #: Every metadata key (``general.architecture``, ``llama.block_count``, ``tokenizer.ggml.tokens``…).
    metadata: dict[str, Any]
    #: Tensor name -> its GGML type name (``Q4_1``, ``F32``…).
    tensor_types: dict[str, str]

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def type_counts(self) -> dict[str, int]:
        return dict(collections.Counter(self.tensor_types.values()))


class GGUFError(ModelLoadError):
    """A GGUF file that cannot be served: the message names the file and the reason."""


def is_gguf_path(path: str) -> bool:
    """A ``.gguf`` file, or a local directory holding exactly one."""
    candidate = pathlib.Path(path)
    if candidate.suffix.lower() == GGUF_SUFFIX:
        return True
    return candidate.is_dir() and len(_gguf_files(candidate)) == 1 and not (candidate / "config.json").exists()


def gguf_file(path: str) -> pathlib.Path:
    """The GGUF file ``path`` names (itself, or the one file in its directory)."""
    candidate = pathlib.Path(path).expanduser()
    if candidate.is_dir():
        files = _gguf_files(candidate)
        if len(files) != 1:
            raise GGUFError(f"{candidate}: expected one .gguf file in the directory, found {len(files)}")
        return files[0]
    if not candidate.is_file():
        raise GGUFError(f"{candidate}: no such GGUF file")
    return candidate


def read_header(path: pathlib.Path) -> GGUFHeader:
    """Read and check ``path``'s header: GGUF magic, every tensor inside the file, and every
    tensor of a type MLX keeps (:data:`NATIVE_TYPES`)."""
    size = os.path.getsize(path)
    try:
        reader = _BoundedReader(path)
    except _PastEnd as exc:
        raise GGUFError(f"{path}: truncated: it needs at least {exc.end:,} bytes, the file has {size:,}") from None
    except Exception as exc:  # boundary: the reader's ValueError / struct / numpy errors
        raise GGUFError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    tensor_types: dict[str, str] = {}
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise GGUFError(f"{path}: truncated: tensor {tensor.name!r} ends at byte {end:,}, the file has {size:,}")
        tensor_types[tensor.name] = tensor.tensor_type.name
    _check_types(path, tensor_types)
    metadata = {name: _plain(field.contents()) for name, field in reader.fields.items()}
    return GGUFHeader(path=path, metadata=metadata, tensor_types=tensor_types)


class _PastEnd(Exception):
    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _BoundedReader(GGUFReader):
    """llama.cpp's reader, raising :class:`_PastEnd` where it would read past the end of the
    file (by itself it slices a short array there, and fails later with a numpy error)."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise _PastEnd(end)
        return super()._get(offset, dtype, count, override_order)


def _check_types(path: pathlib.Path, tensor_types: dict[str, str]) -> None:
    foreign = collections.Counter(kind for kind in tensor_types.values() if kind not in NATIVE_TYPES)
    if foreign:
        listed = ", ".join(f"{kind} ({count} tensors)" for kind, count in sorted(foreign.items()))
        raise GGUFError(
            f"{path}: quantization {listed} has no MLX layout (MLX keeps F32, F16, BF16, Q4_0, Q4_1 and "
            "Q8_0 as stored); use a Q4_0, Q4_1 or Q8_0 file of the model, or its safetensors checkpoint"
        )


def _gguf_files(directory: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in directory.iterdir() if p.suffix.lower() == GGUF_SUFFIX and p.is_file())


def _plain(value: Any) -> Any:
    """numpy scalars and arrays from the reader as Python values."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
