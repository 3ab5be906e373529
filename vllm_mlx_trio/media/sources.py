"""Where a media part's bytes come from: a base64 ``data:`` URL, an http(s) URL (fetched with
the SSRF guard in :mod:`.fetch`), or a local file under ``mllm.allowed_local_dirs``.
Anything else is refused. Every source stops at the byte limit of its kind."""

from __future__ import annotations

import base64
import binascii
import os
import stat
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import attrs

from ..config.sections import MllmSection
from .fetch import Connector, Resolver, fetch_url
from .loaded import refuse

#: Bytes read from a local file per ``os.read`` call.
READ_CHUNK = 1 << 20


@attrs.frozen
class RawMedia:
    """A part's encoded bytes and the media type its source declared (None: none declared)."""

    data: bytes = attrs.field(repr=False)
    declared_type: str | None


def read_source(
    ref: bytes | str,
    *,
    kind: str,
    max_bytes: int,
    cfg: MllmSection,
    where: str,
    resolver: Resolver | None = None,
    connector: Connector | None = None,
) -> RawMedia:
    """The bytes of ``ref`` (``kind``: "image" or "video", the family a declared type must be in)."""
    if isinstance(ref, bytes):
        return _checked_size(ref, None, max_bytes, where)
    scheme = ref.split(":", 1)[0].lower() if ":" in ref[:16] else ""
    if scheme == "data":
        return _data_url(ref, kind=kind, max_bytes=max_bytes, where=where)
    if scheme in ("http", "https"):
        if not cfg.allow_url_fetch:
            raise refuse(where, "fetching media URLs is turned off on this server (mllm.allow_url_fetch).")
        fetched = fetch_url(
            ref,
            where=where,
            max_bytes=max_bytes,
            timeout_s=cfg.fetch_timeout_s,
            max_redirects=cfg.max_redirects,
            allow_private=cfg.allow_private_urls,
            resolver=resolver,
            connector=connector,
        )
        return RawMedia(data=fetched, declared_type=None)
    if scheme == "file" or ref.startswith("/"):
        path = unquote(urlsplit(ref).path) if scheme == "file" else ref
        return RawMedia(data=read_local_file(path, cfg.allowed_local_dirs, max_bytes, where), declared_type=None)
    shown = ref[:32] + ("..." if len(ref) > 32 else "")
    raise refuse(
        where, f"unsupported {kind} source {shown!r}: send a base64 data: URL, an http(s) URL or an allowed local path."
    )


def _checked_size(data: bytes, declared: str | None, max_bytes: int, where: str) -> RawMedia:
    if len(data) > max_bytes:
        raise refuse(where, f"the media is {len(data)} bytes, more than the limit of {max_bytes}.")
    return RawMedia(data=data, declared_type=declared)


def _data_url(ref: str, *, kind: str, max_bytes: int, where: str) -> RawMedia:
    """``data:<kind>/<subtype>[;param...];base64,<payload>``: strict base64 (no whitespace, correct padding)."""
    header, comma, payload = ref[5:].partition(",")
    params = [p.strip().lower() for p in header.split(";")]
    if not comma or len(params) < 2 or params[-1] != "base64":
        raise refuse(where, f"a data: URL must look like data:{kind}/<type>;base64,<data>.")
    declared = params[0]
    if not declared.startswith(f"{kind}/"):
        raise refuse(where, f"the data: URL declares {declared or 'no media type'!r}, which is not {kind}/*.")
    if len(payload) // 4 * 3 > max_bytes + 2:  # refused before decoding anything
        raise refuse(where, f"the {kind} is over the limit of {max_bytes} bytes.")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise refuse(where, "the data: URL's payload is not valid base64.") from None
    if not data:
        raise refuse(where, f"the data: URL holds no {kind} data.")
    return _checked_size(data, declared, max_bytes, where)


def read_local_file(path: str, allowed_dirs: tuple[str, ...], max_bytes: int, where: str) -> bytes:
    """A regular file whose resolved path (symlinks followed, ``..`` collapsed) lies inside one
    of ``allowed_dirs`` (themselves resolved). Opened without following a final symlink and
    without blocking (a FIFO is refused, not waited on)."""
    if not allowed_dirs:
        raise refuse(where, "local file paths are not allowed on this server (mllm.allowed_local_dirs is empty).")
    resolved = os.path.realpath(path)
    if not any(_inside(resolved, os.path.realpath(d)) for d in allowed_dirs):
        raise refuse(where, "the local path is outside the allowed directories (mllm.allowed_local_dirs).")
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        raise refuse(where, "the local file cannot be opened.") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise refuse(where, "the local path is not a regular file.")
        if info.st_size > max_bytes:
            raise refuse(where, f"the file is {info.st_size} bytes, more than the limit of {max_bytes}.")
        return _read_at_most(lambda size: os.read(fd, size), max_bytes, where)
    finally:
        os.close(fd)


def _inside(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _read_at_most(read: Callable[[int], bytes], max_bytes: int, where: str) -> bytes:
    """Read to the end, refusing as soon as more than ``max_bytes`` arrived."""
    chunks, total = [], 0
    while chunk := read(READ_CHUNK):
        total += len(chunk)
        if total > max_bytes:
            raise refuse(where, f"the media is over the limit of {max_bytes} bytes.")
        chunks.append(chunk)
    return b"".join(chunks)
