"""One spilled prefix block as a safetensors file, written and read without MLX.

The file is plain safetensors (8-byte little-endian header length, a JSON header, the raw
tensor bytes), written by hand so a writer thread never touches MLX: the MLX thread turns a
block into numpy arrays (:func:`to_host`), the writer thread encodes and writes them
(:func:`encode`), and a later hit decodes them (:func:`decode`) and makes MLX arrays again
(:func:`to_device`). The header's ``__metadata__`` names the format and its version, the
model the block belongs to, the block's hash and a checksum of the tensor bytes and of the
header itself (tensor specs and metadata: a flipped shape or layout is caught too), so a
truncated, corrupted or foreign file is told apart from a good one (:class:`BadBlockFile`).

Tensors of ``kv`` layer ``i`` are ``k{i}`` and ``v{i}``; a block kept quantized
(:class:`~.layers.Packed`) stores ``k{i}.weights``, ``k{i}.scales`` (and ``.biases``)
with its shape, dtype, group size and bits in the metadata's ``packed`` entry.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

import mlx.core as mx
import numpy as np

from .layers import BlockArrays, Packed

FORMAT = "vllm-mlx-trio/kv-block"
#: Bump when the layout of a block file changes: older files are then foreign (deleted).
#: 2: the checksum covers the header too.
FORMAT_VERSION = "2"
_U64 = struct.Struct("<Q")
_CHECKSUM_HEX = 32  # blake2b, 16 bytes
#: Largest header we accept: a block has two tensors (six when packed) per layer.
_MAX_HEADER_BYTES = 16 * 1024 * 1024

# safetensors dtype names; bfloat16 travels as its raw 16 bits (numpy has no bfloat16)
_TO_ST = {
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.uint32): "U32",
    np.dtype(np.uint16): "BF16",
    np.dtype(np.uint8): "U8",
}
_FROM_ST = {"F32": np.float32, "F16": np.float16, "U32": np.uint32, "BF16": np.uint16, "U8": np.uint8}

#: A block on the host: tensor name -> numpy array, plus the ``packed`` descriptions.
HostBlock = tuple[dict[str, np.ndarray], dict[str, Any]]


class BadBlockFile(ValueError):
    """A block file that is truncated, corrupted, or from another model or format version."""


def _host_array(array: mx.array) -> np.ndarray:
    if array.dtype == mx.bfloat16:
        array = array.view(mx.uint16)
    return np.asarray(array)  # a view of the evaluated array (it keeps the array alive): no copy here


def _device_array(array: np.ndarray, dtype_name: str) -> mx.array:
    out = mx.array(array)
    return out.view(mx.bfloat16) if dtype_name == "bfloat16" else out


def _dtype_name(array: mx.array) -> str:
    return str(array.dtype).removeprefix("mlx.core.")


def to_host(block: BlockArrays) -> HostBlock:
    """A block's arrays as numpy views (on the MLX thread; the writer thread takes it from here).
    A view keeps its evaluated MLX array alive and costs no copy: the block is immutable."""
    mx.eval([a for pair in block for stored in pair for a in (stored if isinstance(stored, Packed) else [stored])])
    tensors: dict[str, np.ndarray] = {}
    packed: dict[str, Any] = {}
    dtypes: dict[str, str] = {}
    for index, pair in enumerate(block):
        for prefix, stored in zip(("k", "v"), pair, strict=True):
            name = f"{prefix}{index}"
            if isinstance(stored, Packed):
                packed[name] = {
                    "shape": list(stored.shape),
                    "dtype": _dtype_name(mx.zeros((), dtype=stored.dtype)),
                    "group_size": stored.group_size,
                    "bits": stored.bits,
                }
                parts = {"weights": stored.weights, "scales": stored.scales, "biases": stored.biases}
                for part, array in parts.items():
                    if array is not None:
                        tensors[f"{name}.{part}"] = _host_array(array)
                        dtypes[f"{name}.{part}"] = _dtype_name(array)
            else:
                tensors[name] = _host_array(stored)
                dtypes[name] = _dtype_name(stored)
    return tensors, {"packed": packed, "dtypes": dtypes, "num_layers": len(block)}


def to_device(host: HostBlock) -> BlockArrays:
    """The block again, as MLX arrays (on the MLX thread)."""
    tensors, info = host
    dtypes, packed = info["dtypes"], info["packed"]

    def stored(name: str) -> mx.array | Packed:
        if name not in packed:
            return _device_array(tensors[name], dtypes[name])
        p = packed[name]
        parts = {
            part: _device_array(tensors[f"{name}.{part}"], dtypes[f"{name}.{part}"])
            for part in ("weights", "scales", "biases")
            if f"{name}.{part}" in tensors
        }
        return Packed(
            parts["weights"],
            parts["scales"],
            parts.get("biases"),
            tuple(p["shape"]),
            getattr(mx, p["dtype"]),
            p["group_size"],
            p["bits"],
        )

    return [(stored(f"k{i}"), stored(f"v{i}")) for i in range(info["num_layers"])]


def _header_fields(host: HostBlock, *, model_id: str, key_hex: str) -> dict[str, Any]:
    """The header as a dict: each tensor's spec, and the metadata without its checksum."""
    tensors, info = host
    header: dict[str, Any] = {}
    offset = 0
    for name, array in tensors.items():
        spec = {
            "dtype": _TO_ST[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        header[name] = spec
        offset += array.nbytes
    header["__metadata__"] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": model_id,
        "block_hash": key_hex,
        "layout": json.dumps(info, sort_keys=True),
    }
    return header


def _checksum(header: dict[str, Any], body: bytes) -> str:
    """Of the header's fields (as parsed, canonically: any change to one shows) and the data."""
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    h = hashlib.blake2b(canonical, digest_size=_CHECKSUM_HEX // 2)
    h.update(body)
    return h.hexdigest()


def _header(header: dict[str, Any], checksum: str) -> bytes:
    with_checksum = {**header, "__metadata__": {**header["__metadata__"], "checksum": checksum}}
    raw = json.dumps(with_checksum, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors aligns the data to 8 bytes
    return _U64.pack(len(raw)) + raw


def encoded_size(host: HostBlock, *, model_id: str, key_hex: str) -> int:
    """The size :func:`encode` will give, without the work (the checksum has a fixed length)."""
    header = _header(_header_fields(host, model_id=model_id, key_hex=key_hex), "0" * _CHECKSUM_HEX)
    return len(header) + sum(array.nbytes for array in host[0].values())


def encode(host: HostBlock, *, model_id: str, key_hex: str) -> bytes:
    """The safetensors bytes of a block (on the writer thread)."""
    body = b"".join(np.ascontiguousarray(array).tobytes() for array in host[0].values())
    fields = _header_fields(host, model_id=model_id, key_hex=key_hex)
    return _header(fields, _checksum(fields, body)) + body


def data_size(header: dict[str, Any]) -> int:
    """How many data bytes the header's tensors span (a shorter file is truncated);
    BadBlockFile if a tensor's spec is malformed."""
    try:
        ends = [int(spec["data_offsets"][1]) for name, spec in header.items() if name != "__metadata__"]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise BadBlockFile(f"malformed tensor spec: {exc!r}") from None
    return max(ends, default=0)


def read_metadata(data: bytes) -> tuple[dict[str, Any], int]:
    """The header of a block file and where its data starts; BadBlockFile if unreadable."""
    if len(data) < _U64.size:
        raise BadBlockFile("shorter than a header")
    (length,) = _U64.unpack_from(data)
    if length > _MAX_HEADER_BYTES or _U64.size + length > len(data):
        raise BadBlockFile("truncated header")
    try:
        header = json.loads(data[_U64.size : _U64.size + length])
    except ValueError as exc:
        raise BadBlockFile(f"unreadable header: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise BadBlockFile("no metadata")
    return header, _U64.size + length


def check_identity(metadata: dict[str, Any], *, model_id: str, key_hex: str | None) -> None:
    """BadBlockFile unless the metadata names this format version, model and (if given) hash."""
    if metadata.get("format") != FORMAT or metadata.get("format_version") != FORMAT_VERSION:
        raise BadBlockFile(f"format {metadata.get('format')!r} v{metadata.get('format_version')!r}")
    if metadata.get("model") != model_id:
        raise BadBlockFile(f"another model's block ({metadata.get('model')!r})")
    if key_hex is not None and metadata.get("block_hash") != key_hex:
        raise BadBlockFile("named for another block")


def decode(data: bytes, *, model_id: str, key_hex: str) -> HostBlock:
    """A block file's arrays, checked against its metadata; BadBlockFile if it is not good."""
    header, start = read_metadata(data)
    metadata = header["__metadata__"]
    check_identity(metadata, model_id=model_id, key_hex=key_hex)
    body = data[start:]
    checksum = metadata.pop("checksum", None)
    if _checksum(header, body) != checksum:
        raise BadBlockFile("checksum mismatch (truncated or corrupted)")
    del header["__metadata__"]
    try:
        info = json.loads(metadata["layout"])
        tensors = {}
        for name, spec in header.items():
            begin, end = spec["data_offsets"]
            dtype = np.dtype(_FROM_ST[spec["dtype"]])
            tensors[name] = np.frombuffer(body[begin:end], dtype=dtype).reshape(spec["shape"])
    except (KeyError, ValueError, TypeError) as exc:
        raise BadBlockFile(f"malformed tensors: {exc}") from None
    return tensors, info
