"""The official SDKs' clients pointed at a test server: a placeholder key, no retries (a
test sees the first answer, whatever it is)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai


def openai_client(url: str, *, api_key: str = "unused", **kwargs: Any) -> openai.AsyncOpenAI:
    """An OpenAI client for the server at ``url`` (its ``/v1`` routes)."""
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, **kwargs)


def anthropic_client(url: str, *, api_key: str = "unused", **kwargs: Any) -> anthropic.AsyncAnthropic:
    """An Anthropic client for the server at ``url`` (it adds ``/v1/messages`` itself)."""
    return anthropic.AsyncAnthropic(base_url=url, api_key=api_key, max_retries=0, **kwargs)
