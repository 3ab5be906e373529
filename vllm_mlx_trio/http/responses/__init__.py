"""OpenAI's Responses API (``/v1/responses``) onto the engine."""

from .routes import register_responses_routes

__all__ = ["register_responses_routes"]
