"""Anthropic's Messages API (``/v1/messages``) onto the engine."""

from .routes import register_anthropic_routes

__all__ = ["register_anthropic_routes"]
