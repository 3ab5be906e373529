"""CORS: which browser origins may call the API (``server.cors_origins``).

With no origins configured nothing here runs: no ``Access-Control-*`` header on any
response, and an ``OPTIONS`` request is an ordinary request. With origins, a request whose
``Origin`` is listed (or any origin, with ``"*"``) gets ``Access-Control-Allow-Origin`` on
every response, errors and SSE streams included; a preflight (``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) is answered 204 before authentication, since browsers never
send credentials on one. An unlisted origin gets no CORS header, and so no access.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import quart

ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
DEFAULT_ALLOW_HEADERS = "Authorization, Content-Type, X-Request-Id"
EXPOSE_HEADERS = "X-Request-Id, Retry-After"
#: Seconds a browser may cache a preflight's answer.
MAX_AGE_S = 600
#: A preflight's requested headers are echoed when they are header names, this many at most.
MAX_REQUESTED_HEADERS = 64
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class CorsPolicy:
    """The configured origins and the headers each response gets."""

    __slots__ = ("_any", "_origins")

    def __init__(self, origins: Iterable[str] = ()):
        origins = tuple(origins)
        self._any = "*" in origins
        self._origins = frozenset(origin.lower() for origin in origins if origin != "*")

    @property
    def enabled(self) -> bool:
        return self._any or bool(self._origins)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and (self._any or origin.lower() in self._origins)

    def response_headers(self, origin: str | None) -> dict[str, str]:
        """The CORS headers for a response to a request from ``origin`` (none if unlisted)."""
        if not self.allows(origin):
            return {}
        assert origin is not None
        return {
            "Access-Control-Allow-Origin": "*" if self._any else origin,
            "Access-Control-Expose-Headers": EXPOSE_HEADERS,
        }

    @property
    def varies(self) -> bool:
        """Whether responses depend on ``Origin`` (then they say ``Vary: Origin``)."""
        return bool(self._origins) and not self._any

    def is_preflight(self, method: str, origin: str | None, request_method: str | None) -> bool:
        return self.enabled and method == "OPTIONS" and origin is not None and request_method is not None

    def preflight_headers(self, origin: str | None, requested_headers: str | None) -> dict[str, str]:
        """A preflight's extra headers (with :meth:`response_headers`); none if unlisted."""
        if not self.allows(origin):
            return {}
        return {
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Allow-Headers": allowed_headers(requested_headers),
            "Access-Control-Max-Age": str(MAX_AGE_S),
        }


def allowed_headers(requested: str | None) -> str:
    """The preflight's ``Access-Control-Request-Headers`` when it is a list of header
    names; otherwise the headers this API reads."""
    names = [name.strip() for name in (requested or "").split(",") if name.strip()]
    if not names or len(names) > MAX_REQUESTED_HEADERS or not all(_HEADER_NAME.fullmatch(n) for n in names):
        return DEFAULT_ALLOW_HEADERS
    return ", ".join(names)


def register_cors(app: quart.Quart, policy: CorsPolicy) -> None:
    """Answer preflights (a before-request hook: register it before authentication) and add
    the CORS headers to every response (errors included: error handlers' responses pass
    through after-request hooks too)."""
    if not policy.enabled:
        return

    @app.before_request
    async def answer_preflight():
        request = quart.request
        origin = request.headers.get("Origin")
        if not policy.is_preflight(request.method, origin, request.headers.get("Access-Control-Request-Method")):
            return None
        headers = policy.preflight_headers(origin, request.headers.get("Access-Control-Request-Headers"))
        return "", 204, headers

    @app.after_request
    async def add_cors_headers(response: quart.Response):
        response.headers.update(policy.response_headers(quart.request.headers.get("Origin")))
        if policy.varies:
            response.vary.add("Origin")
        return response
