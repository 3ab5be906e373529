"""Reading a JSON request body: size limit, UTF-8, strict JSON (no NaN / Infinity)."""

from __future__ import annotations

import json
from typing import Any

import quart

from ..errors import InvalidRequestError


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


async def read_json_body() -> Any:
    """The request's JSON value; malformed input becomes a 400 naming what is wrong.

    The size limit (``MAX_CONTENT_LENGTH``) is Quart's: a larger body is a 413 before it
    is read in full.
    """
    data = await quart.request.get_data(cache=False, as_text=False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequestError(f"The body is not valid UTF-8: {exc.reason} at byte {exc.start}.") from None
    if not text.strip():
        raise InvalidRequestError("The request body is empty; expected a JSON object.")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvalidRequestError(f"The body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise InvalidRequestError("The body's JSON is nested too deeply.", code="invalid_json") from None
