"""The Quart-Trio application: routes, health, and errors mapped to OpenAI's shape."""

from __future__ import annotations

import logging

import quart
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..config import EngineConfig
from ..engine import Engine
from ..errors import VllmMlxTrioError
from .anthropic import register_anthropic_routes
from .auth import ApiKeys, load_api_keys, register_auth
from .cache_routes import register_cache_routes
from .close_connection import close_after_last_body
from .cors import CorsPolicy, register_cors
from .errors import describe, error_body
from .openai.embeddings import register_embeddings_route
from .openai.routes import register_routes
from .ops_routes import ThroughputMeter, register_ops_routes
from .request_log import REQUEST_ID_HEADER, request_id_from
from .request_streams import close_streams_at_end
from .responses import register_responses_routes
from .tokenize_routes import register_tokenize_routes

logger = logging.getLogger(__name__)

_HTTP_ERROR_TYPES = {413: "request_too_large", 404: "not_found_error", 405: "invalid_request_error"}


def create_app(
    engine: Engine,
    cfg: EngineConfig,
    *,
    throughput: ThroughputMeter | None = None,
    api_keys: ApiKeys | None = None,
) -> QuartTrio:
    """An app serving ``engine``; it shares the engine's lifetime, it does not own it.

    ``throughput`` feeds ``/v1/status``'s ``tokens_per_s``; run its ``run()`` next to the
    server for a sliding window (without it the rate is the average since start).
    ``api_keys`` defaults to :func:`load_api_keys` of ``cfg`` and the environment (a
    :class:`ConfigError` when the key file is bad).
    """
    api_keys = load_api_keys(cfg.server) if api_keys is None else api_keys
    app = QuartTrio("vllm_mlx_trio")
    app.config["MAX_CONTENT_LENGTH"] = cfg.limits.max_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # long streams are normal here
    app.config["BODY_TIMEOUT"] = cfg.limits.body_timeout_s  # a body sent too slowly: 408
    app.config["JSON_SORT_KEYS"] = False
    app.json.sort_keys = False
    app.json.ensure_ascii = False
    register_routes(app, engine)
    register_anthropic_routes(app, engine)
    register_responses_routes(app, engine)
    register_cache_routes(app, engine)
    register_tokenize_routes(app, engine)
    register_embeddings_route(app, engine)
    register_ops_routes(app, engine, throughput or ThroughputMeter.for_engine(engine))
    app.asgi_app = close_streams_at_end(close_after_last_body(app.asgi_app))  # type: ignore[method-assign]

    register_request_ids_and_access(app, cfg, api_keys)
    _register_health(app, engine)
    register_error_handlers(app)
    return app


def register_request_ids_and_access(app: QuartTrio, cfg: EngineConfig, api_keys: ApiKeys) -> None:
    """Every request gets an id (echoed on every response); CORS preflights are answered, then keys checked."""

    @app.before_request
    async def take_request_id():
        quart.g.request_id = request_id_from(quart.request.headers.get(REQUEST_ID_HEADER))

    # In this order, after the request id: a preflight is answered before authentication.
    register_cors(app, CorsPolicy(cfg.server.cors_origins))
    register_auth(app, api_keys)

    @app.after_request
    async def echo_request_id(response: quart.Response):
        # Every response carries it, errors included (set above before any handler runs).
        response.headers[REQUEST_ID_HEADER] = quart.g.get("request_id") or request_id_from(None)
        return response


def _register_health(app: QuartTrio, engine: Engine) -> None:
    """``/health``: ok, draining or failed (503 for the last two)."""

    @app.get("/health")
    async def health():
        now = engine.health  # one snapshot
        if now.error is not None:
            return {"status": "failed", "error": str(now.error)}, 503
        if now.draining:
            return {"status": "draining"}, 503
        return {"status": "ok"}


def register_error_handlers(app: QuartTrio) -> None:
    """Every error in the OpenAI shape: ours by their status, HTTP ones by name, anything else a 500."""

    @app.errorhandler(VllmMlxTrioError)
    async def our_error(exc: VllmMlxTrioError):
        status, body, headers = describe(exc)
        return body, status, headers

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException):
        status = exc.code or 500
        kind = _HTTP_ERROR_TYPES.get(status, "invalid_request_error")
        body = error_body(exc.description or exc.name, type=kind, code=exc.name.lower().replace(" ", "_"))
        # An unread body is still on the wire: the connection cannot carry another request.
        headers = {"Connection": "close"} if status == 413 else {}
        return body, status, headers

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception):
        logger.exception("unhandled error in a request handler")
        return error_body("Internal server error.", type="server_error"), 500
