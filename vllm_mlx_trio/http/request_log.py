"""Request ids (``X-Request-Id``) and the one INFO line logged per completion request.

The line names the request, its outcome and its numbers, never its prompt or output text:
``request finished request_id=... endpoint=... status=ok|error|aborted prompt_tokens=...
completion_tokens=... cached_tokens=... ttft_s=... duration_s=... finish_reason=...
error=...``. With ``logging.format = "json"`` the same fields are keys of the line's object.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import trio
from werkzeug.exceptions import HTTPException

from ..engine import Engine
from ..errors import VllmMlxTrioError
from ..logs import FIELDS, logfmt
from ..metrics import EngineMetrics
from ..stream import RequestStream
from .errors import describe
from .openai.responses import combined_usage

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-Id"
MAX_REQUEST_ID_CHARS = 128
_VALID_REQUEST_ID = re.compile(rf"[\x20-\x7e]{{1,{MAX_REQUEST_ID_CHARS}}}")


def request_id_from(header: str | None) -> str:
    """The client's ``X-Request-Id`` when it is 1..128 printable ASCII characters (surrounding
    spaces dropped), else a new ``req-<32 hex>`` id."""
    if header is not None and _VALID_REQUEST_ID.fullmatch(stripped := header.strip()):
        return stripped
    return f"req-{uuid.uuid4().hex}"


def is_cancellation(exc: BaseException | None) -> bool:
    """``trio.Cancelled``, or a group made only of them (a nursery's way of passing it on)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(is_cancellation(sub) for sub in exc.exceptions)
    return False


def error_code(exc: BaseException) -> str:
    """A short name for a failure: the OpenAI error code (or type) it is answered with."""
    if isinstance(exc, VllmMlxTrioError):
        error = describe(exc)[1]["error"]
        return error["code"] or error["type"]
    if isinstance(exc, HTTPException):
        return exc.name.lower().replace(" ", "_")
    return "server_error"


class EngineIds:
    """Engine request ids in use by this app's requests, so no two requests share one.

    A client may send the same ``X-Request-Id`` twice (a retry while the first attempt still
    runs); the engine's ids must be unique, so the second request's engine ids get a ``~2``
    (``~3``...) suffix. Its log line and ``X-Request-Id`` header keep the client's id.
    """

    def __init__(self, engine: Engine):
        self._engine = engine
        self._ids: set[str] = set()

    def reserve(self, base: str, n: int) -> list[str]:
        """Ids for ``n`` choices: ``base`` alone, or ``base-0``, ``base-1``... when n > 1."""
        stem, attempt = base, 1
        while True:
            ids = [stem] if n == 1 else [f"{stem}-{i}" for i in range(n)]
            if not any(i in self._ids or self._engine.holds_request(i) for i in ids):
                self._ids.update(ids)
                return ids
            attempt += 1
            stem = f"{base}~{attempt}"

    def release(self, ids: Sequence[str]) -> None:
        self._ids.difference_update(ids)


class RequestRecord:
    """One completion request's timings and outcome, logged once when it is over.

    ``finish`` is idempotent: the first outcome wins. A client disconnect (the handler or
    the SSE body cancelled) also counts ``vllm:http_requests_client_disconnected``.
    """

    def __init__(self, request_id: str, endpoint: str, metrics: EngineMetrics, *, on_finish: Callable[[], None]):
        self.request_id = request_id
        self.endpoint = endpoint
        self.streams: list[RequestStream] = []
        self._metrics = metrics
        self._on_finish = on_finish
        self._started = trio.current_time()
        self._submitted: float | None = None
        self._first_delta: float | None = None
        self._done = False
        #: Input tokens of a request that has no streams (an embedding request's).
        self.input_tokens = 0

    def submitting(self) -> None:
        """The first engine request is about to be submitted: TTFT counts from here."""
        if self._submitted is None:
            self._submitted = trio.current_time()

    def delta(self) -> None:
        """A choice's delta arrived (the first one of any choice ends the TTFT)."""
        if self._first_delta is None:
            self._first_delta = trio.current_time()

    def disconnected(self) -> None:
        self._metrics.client_disconnected(self.endpoint)
        self.finish("aborted")

    @contextmanager
    def outcome(self) -> Iterator[None]:
        """Around a handler: a failure is logged (``error``, or ``aborted`` when cancelled)
        and re-raised; a streaming response's body logs its own outcome."""
        try:
            yield
        except BaseException as exc:  # classified, logged and re-raised, never swallowed
            if is_cancellation(exc):
                self.disconnected()
            else:
                self.finish("error", error=error_code(exc))
            raise

    def stream_ended(self, exc: BaseException | None, *, error: str | None, complete: bool) -> None:
        """A streaming body is over: a disconnect, an in-band ``error`` already sent, the body's
        own failure ``exc``, or the end (``ok`` when its last event went out, else ``aborted``)."""
        if is_cancellation(exc):
            self.disconnected()
        elif error is not None:
            self.finish("error", error=error)
        elif exc is not None:
            self.finish("error", error=error_code(exc))
        else:
            self.finish("ok" if complete else "aborted")

    def finish(self, status: str, *, error: str | None = None) -> None:
        if self._done:
            return
        self._done = True
        self._on_finish()
        fields = self.fields(status, error)
        logger.info("request finished %s", logfmt(fields), extra={FIELDS: fields})

    def fields(self, status: str, error: str | None) -> dict:
        usage = combined_usage([s.usage for s in self.streams]) if self.streams else None
        now = trio.current_time()
        ttft = None
        if self._submitted is not None and self._first_delta is not None:
            ttft = round(self._first_delta - self._submitted, 6)
        return {
            "request_id": self.request_id,
            "endpoint": self.endpoint,
            "status": status,
            "prompt_tokens": usage.prompt_tokens if usage else self.input_tokens,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "cached_tokens": usage.cached_tokens if usage else 0,
            "ttft_s": ttft,
            "duration_s": round(now - self._started, 6),
            "finish_reason": _finish_reasons(self.streams),
            "error": error,
        }


def _finish_reasons(streams: list[RequestStream]) -> str | None:
    """The choice's finish reason; with n > 1 each choice's, comma-separated (``-``: none)."""
    if not streams:
        return None
    if len(streams) == 1:
        return streams[0].finish_reason
    return ",".join(s.finish_reason or "-" for s in streams)
