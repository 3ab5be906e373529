"""Chained content hashes for prefix-cache blocks. Pure: no Trio, no MLX, no I/O.

A block's hash names its whole prefix: the parent block's hash, the block's own token ids and
(for the first block only, by the pool's convention) the request's extra keys, and the keys of
the media items whose tokens start inside the block. Two blocks with
equal hashes therefore hold the KV of equal token prefixes under equal extra keys.

The hash is SHA-256 over a canonical, tagged and length-prefixed byte encoding, truncated to
16 bytes. It is stable across processes and Python versions (unlike ``hash()``, which is
salted per process for ``str`` and ``bytes``) and a chance collision among 2**32 cached
blocks has probability about 2**-64.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Hashable

HASH_NBYTES = 16
"""Length of a block hash in bytes."""

_DOMAIN = b"vllm-mlx-trio/block-hash/v1\x00"
_U64 = struct.Struct("<Q")


def block_hash(
    parent: bytes | None,
    token_ids: tuple[int, ...],
    extra_keys: tuple[Hashable, ...] = (),
    media: tuple[tuple[int, Hashable], ...] = (),
) -> bytes:
    """The 16-byte hash of a block holding ``token_ids`` after the block hashed ``parent``.

    ``parent`` is None for a sequence's first block. ``extra_keys`` may hold None, bools,
    ints, strs, bytes and (nested) tuples of those: e.g. an image's content hash or a
    request's ``cache_salt``. Any other type raises TypeError (it has no canonical bytes).
    Token ids must fit in a signed 64-bit int. ``media`` holds the (start position, content
    key) of the media items starting inside this block (``core/prefix/media_keys.py``); without any,
    the hash is what it was before media keys existed.
    """
    h = hashlib.sha256(_DOMAIN)
    if parent is None:
        h.update(b"\x00")
    else:
        h.update(b"\x01" + _U64.pack(len(parent)) + parent)
    h.update(_U64.pack(len(token_ids)))
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(encode_key(extra_keys))
    if media:  # after a self-delimiting tuple: "no media" and "some media" never collide
        h.update(b"M" + encode_key(media))
    return h.digest()[:HASH_NBYTES]


def encode_key(value: object) -> bytes:
    """A canonical, injective byte encoding of a hashable key made of plain values."""
    out: list[bytes] = []
    _encode(value, out)
    return b"".join(out)


def _encode(value: object, out: list[bytes]) -> None:
    if value is None:
        out.append(b"N")
    elif isinstance(value, bool):  # before int: bool is an int subclass
        out.append(b"T" if value else b"F")
    elif isinstance(value, int):
        _tagged(b"I", str(int(value)).encode("ascii"), out)
    elif isinstance(value, str):
        _tagged(b"S", value.encode("utf-8", "surrogatepass"), out)
    elif isinstance(value, bytes):
        _tagged(b"B", value, out)
    elif isinstance(value, tuple):
        out.append(b"U" + _U64.pack(len(value)))
        for item in value:
            _encode(item, out)
    else:
        raise TypeError(f"cannot hash a {type(value).__name__} into a block key")


def _tagged(tag: bytes, payload: bytes, out: list[bytes]) -> None:
    out.append(tag + _U64.pack(len(payload)) + payload)
