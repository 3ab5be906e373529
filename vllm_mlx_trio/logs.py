"""Log formatting: plain text or one JSON object per line, control characters escaped.

A record may carry structured fields (``extra={FIELDS: {...}}``, as the per-request line of
the HTTP layer does): the JSON format puts them in the object as keys, the text format
leaves them to the message, which already names them.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping
from typing import Any

from .config import LoggingConfig

#: The attribute of a LogRecord holding its structured fields (a dict).
FIELDS = "vmt_fields"
_BASE_KEYS = ("time", "level", "logger", "message")


def escape_control(text: str) -> str:
    """``text`` with control and other non-printable characters as escapes (``\\n``, ``\\x1b``).

    A value from a client (a header, an error message) cannot then forge log lines or
    drive a terminal. Printable non-ASCII text is kept.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def logfmt(fields: Mapping[str, Any]) -> str:
    """``key=value key=value``: None is ``-``, floats get 4 decimals, and a value with a
    space, quote or ``=`` is quoted (JSON string syntax); control characters are escaped."""
    return " ".join(f"{key}={logfmt_value(value)}" for key, value in fields.items())


def logfmt_value(value: Any) -> str:
    """One value as :func:`logfmt` writes it."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    text = escape_control(str(value))
    if not text or any(c in text for c in ' "='):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """The standard formatter with the message's control characters escaped (a traceback,
    appended after the message, keeps its newlines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = escape_control(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, then the
    record's structured fields; a traceback goes under ``exc_info``."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC)
        obj: dict[str, Any] = {
            "time": created.isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, Mapping):
            obj.update((k, v) for k, v in fields.items() if k not in _BASE_KEYS)
        if record.exc_info:
            obj["exc_info"] = self.formatException(record.exc_info)
        elif record.exc_text:
            obj["exc_info"] = record.exc_text
        # ensure_ascii: every control character (C0, DEL, C1, U+2028...) leaves as an escape.
        return json.dumps(obj, ensure_ascii=True, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def make_formatter(fmt: str) -> logging.Formatter:
    """The formatter for ``logging.format`` ("text" or "json")."""
    return JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT)


def configure_logging(cfg: LoggingConfig) -> None:
    """Root logger to stderr at ``cfg.level`` in ``cfg.format``; replaces earlier handlers."""
    handler = logging.StreamHandler()
    handler.setFormatter(make_formatter(cfg.format))
    logging.basicConfig(level=cfg.level.upper(), handlers=[handler], force=True)
