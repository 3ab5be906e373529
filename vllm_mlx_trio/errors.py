"""One exception tree for everything this package raises on purpose.

Foreign exceptions (tokenizer, MLX, cattrs, JSON) are translated into these at the boundary
where they arise; the HTTP layer maps each class to one OpenAI-shaped error response.
"""

from __future__ import annotations


class VllmMlxTrioError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(VllmMlxTrioError):
    """The configuration is invalid: the message names the key and what was expected."""


class InvalidRequestError(VllmMlxTrioError):
    """A request that can never be served as sent (HTTP 400).

    ``param`` names the offending field, ``code`` is a short machine-readable reason.
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class PromptTooLongError(InvalidRequestError):
    """The prompt (plus the tokens asked for) does not fit in the model's context."""

    def __init__(self, message: str, *, param: str | None = "messages"):
        super().__init__(message, param=param, code="context_length_exceeded")


class ModelNotFoundError(VllmMlxTrioError):
    """The request names a model this server does not serve (HTTP 404)."""

    def __init__(self, model: str):
        super().__init__(f"The model '{model}' does not exist.")
        self.model = model


class QueueFullError(VllmMlxTrioError):
    """Admission refused: running and waiting slots are all taken (HTTP 429)."""


class EngineClosedError(VllmMlxTrioError):
    """The engine is shutting down or has stopped; no new requests (HTTP 503)."""


class EngineLoadingError(VllmMlxTrioError):
    """The model is still loading (HTTP 503)."""


class ExecutorCrashedError(VllmMlxTrioError):
    """The MLX executor failed; every in-flight request fails with this (HTTP 500/503)."""


class EngineStalledError(ExecutorCrashedError):
    """A model step ran past ``limits.engine_stall_timeout_s``: the engine is declared dead."""


class RequestProcessingError(VllmMlxTrioError):
    """One request failed inside the model step (e.g. its logits processor raised); the
    engine and every other request go on (HTTP 500, code ``request_failed``)."""


class ModelLoadError(VllmMlxTrioError):
    """The model could not be loaded: the message is the one-line cause."""


class ModelUnavailableError(VllmMlxTrioError):
    """A model of ``[[models]]`` cannot serve: its load failed, or it can never fit in the
    models' memory budget (HTTP 503, code ``model_unavailable``); the other models go on."""
