"""OpenAI-shaped error bodies, and the one map from our error tree to HTTP statuses."""

from __future__ import annotations

import json

from ..errors import (
    EngineClosedError,
    EngineLoadingError,
    ExecutorCrashedError,
    InvalidRequestError,
    ModelNotFoundError,
    ModelUnavailableError,
    QueueFullError,
    RequestProcessingError,
    VllmMlxTrioError,
)

#: Error messages and params are cut to this many characters so a hostile body can't inflate
#: a reply (escaped, a character takes at most 6 bytes of JSON: replies stay under 4 KiB).
MAX_MESSAGE_CHARS = 500
MAX_PARAM_CHARS = 100
#: Seconds a client should wait before retrying a 429 / 503.
RETRY_AFTER_S = 1


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    message = _bounded(message, MAX_MESSAGE_CHARS)
    param = None if param is None else _bounded(param, MAX_PARAM_CHARS)
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _bounded(text: str, limit: int) -> str:
    """At most ``limit`` characters, and encodable as UTF-8 (lone surrogates escaped)."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_json(message: str, **fields: str | None) -> str:
    return json.dumps(error_body(message, **fields))  # type: ignore[arg-type]


def describe(exc: VllmMlxTrioError) -> tuple[int, dict, dict[str, str]]:
    """(status, body, extra headers) for one of our errors."""
    match exc:
        case InvalidRequestError():
            return 400, error_body(exc.message, type="invalid_request_error", param=exc.param, code=exc.code), {}
        case ModelNotFoundError():
            return 404, error_body(str(exc), type="invalid_request_error", param="model", code="model_not_found"), {}
        case QueueFullError():
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            return 429, error_body(str(exc), type="rate_limit_error", code="engine_overloaded"), headers
        case EngineClosedError() | EngineLoadingError():
            headers = {"Retry-After": str(RETRY_AFTER_S)}
            return 503, error_body(str(exc), type="service_unavailable", code="engine_unavailable"), headers
        case ModelUnavailableError():
            return 503, error_body(str(exc), type="service_unavailable", param="model", code="model_unavailable"), {}
        case RequestProcessingError():
            return 500, error_body(str(exc), type="server_error", code="request_failed"), {}
        case ExecutorCrashedError():
            return 500, error_body(str(exc), type="server_error", code="engine_failed"), {}
        case _:
            return 500, error_body(str(exc), type="server_error"), {}
