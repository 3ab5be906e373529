"""API keys: loaded once at startup, checked in constant time on every route but ``/health``.

The key set is the union of the lines of ``server.api_key_file`` (blank lines and lines
starting with ``#`` skipped) and the comma-separated keys in ``$VLLM_MLX_TRIO_API_KEYS``.
With no key at all, authentication is off. Keys never reach a log line, an error message or
a ``repr``: only their SHA-256 digests are kept, and every check compares the digest of the
supplied token with every key's (``hmac.compare_digest``, no early exit), so neither the
time taken nor the length of the answer tells which key, or how much of one, matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
from collections.abc import Iterable, Mapping

import quart

from ..config import API_KEYS_ENV, ServerConfig
from ..errors import ConfigError
from ..logs import logfmt
from .errors import error_body

logger = logging.getLogger(__name__)

#: The one path answered without a key (load balancers and orchestrators probe it).
OPEN_PATHS = frozenset({"/health"})
#: The header Anthropic clients send their key in (checked when there is no Bearer token).
API_KEY_HEADER = "x-api-key"
UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}
MISSING_KEY_MESSAGE = "Missing API key: send the header 'Authorization: Bearer <key>'."
INVALID_KEY_MESSAGE = "Incorrect API key provided."
#: A key is visible ASCII, no spaces: what an ``Authorization: Bearer`` token can carry.
_KEY = re.compile(r"[\x21-\x7e]+")


class ApiKeys:
    """The server's API keys (as digests); empty means authentication is off."""

    __slots__ = ("_digests",)

    def __init__(self, keys: Iterable[str] = ()):
        self._digests = tuple(sorted({_digest(key.encode("ascii")) for key in keys}))

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"ApiKeys({len(self)} keys)"

    def matches(self, token: bytes) -> bool:
        """Whether ``token`` is one of the keys; the same work whichever key (if any) matches."""
        supplied = _digest(token)
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(supplied, digest)
        return matched

    def refusal(self, authorization: bytes | None, api_key: bytes | None = None) -> str | None:
        """None when the request may pass (authentication off, or a listed key in the
        ``Authorization: Bearer`` header, or else in ``x-api-key`` as Anthropic clients send
        it); otherwise the 401's message, which never holds what the client sent."""
        if not self.enabled:
            return None
        token = bearer_token(authorization)
        if token is None and api_key is not None and api_key.strip():
            token = api_key.strip()
        if token is None:
            return MISSING_KEY_MESSAGE
        return None if self.matches(token) else INVALID_KEY_MESSAGE


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (scheme case-insensitive);
    None when the header is absent, empty, or another scheme."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


def load_api_keys(server: ServerConfig, environ: Mapping[str, str] | None = None) -> ApiKeys:
    """The keys of ``server.api_key_file`` and ``$VLLM_MLX_TRIO_API_KEYS`` together.

    Raises :class:`ConfigError` (one line naming the file or the variable, never a key) when
    the file cannot be read, holds no key, or a key is not visible ASCII.
    """
    environ = os.environ if environ is None else environ
    keys = _env_keys(environ.get(API_KEYS_ENV, ""))
    if server.api_key_file is not None:
        keys += _file_keys(server.api_key_file)
    return ApiKeys(keys)


def _env_keys(value: str) -> list[str]:
    keys = [key.strip() for key in value.split(",") if key.strip()]
    for number, key in enumerate(keys, 1):
        if not _KEY.fullmatch(key):
            raise ConfigError(f"{API_KEYS_ENV}: key {number} is not printable ASCII without spaces")
    return keys


def _file_keys(path: str) -> list[str]:
    where = f"server.api_key_file: {path!r}"
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror or type(exc).__name__})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text") from None
    keys = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not _KEY.fullmatch(line):
            raise ConfigError(f"{where}: line {number} is not one key of printable ASCII without spaces")
        keys.append(line)
    if not keys:
        raise ConfigError(f"{where}: holds no API key (only blank lines and # comments)")
    return keys


def unauthorized_body(message: str) -> dict:
    """The 401's OpenAI-shaped body."""
    return error_body(message, type="authentication_error", code="invalid_api_key")


def unauthorized_headers(content_length: str | None, transfer_encoding: str | None) -> dict[str, str]:
    """The 401's headers. A refused request's body is never read: when it has one, the
    connection closes after the 401 (an unread body is still on the wire)."""
    if transfer_encoding is not None or (content_length or "0").strip() != "0":
        return {**UNAUTHORIZED_HEADERS, "Connection": "close"}
    return UNAUTHORIZED_HEADERS


def log_refusal(method: str, path: str, message: str, request_id: str | None = None) -> None:
    """One INFO line per refused request: who and where, never the credential."""
    reason = "missing" if message == MISSING_KEY_MESSAGE else "invalid"
    fields = {"request_id": request_id, "method": method, "path": path, "reason": reason}
    logger.info("unauthorized request %s", logfmt(fields))


def register_auth(app: quart.Quart, keys: ApiKeys) -> None:
    """Refuse, with a 401, every request but ``/health``'s that lacks a valid key.

    Register it after the request-id hook (the 401 carries the id) and after the CORS
    preflight hook (a browser's preflight never carries a key).
    """
    if not keys.enabled:
        return

    @app.before_request
    async def require_api_key():
        request = quart.request
        if request.path in OPEN_PATHS:
            return None
        header = request.headers.get("Authorization")
        api_key = request.headers.get(API_KEY_HEADER)
        message = keys.refusal(
            None if header is None else header.encode("latin-1"),
            None if api_key is None else api_key.encode("latin-1"),
        )
        if message is None:
            return None
        log_refusal(request.method, request.path, message, quart.g.get("request_id"))
        headers = request.headers
        refused = unauthorized_headers(headers.get("Content-Length"), headers.get("Transfer-Encoding"))
        return unauthorized_body(message), 401, refused
