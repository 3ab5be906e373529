"""OpenAI-shaped error bodies, and the one map from our error tree to HTTP statuses."""

from __future__ import annotations

import json

from ..errors import (
    EngineClosedError,
    EngineLoadingError,
    ExecutorCrashedError,
    InvalidRequestError,
    ModelNotFoundError,
    QueueFullError,
    RequestProcessingError,
    VllmMlxTrioError,
)

#: Error messages are cut to this many characters so a hostile body can't inflate a reply.
MAX_MESSAGE_CHARS = 1000
#: Seconds a client should wait before retrying a 429 / 503.
RETRY_AFTER_S = 1


def error_body(message: str, *, type: str, param: str | None = None, code: str | None = None) -> dict:
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[: MAX_MESSAGE_CHARS - 3] + "..."
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


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
        case RequestProcessingError():
            return 500, error_body(str(exc), type="server_error", code="request_failed"), {}
        case ExecutorCrashedError():
            return 500, error_body(str(exc), type="server_error", code="engine_failed"), {}
        case _:
            return 500, error_body(str(exc), type="server_error"), {}
