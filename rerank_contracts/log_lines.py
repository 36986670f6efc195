"""The structured log line every stdlib-only process of the project writes (the activator, the pools' sampler): one
JSON object a line with kopf's keys (``timestamp``, ``severity``, ``message``), as the operator's own logs have them,
so one log pipeline parses them all; a call's own fields (a model, an outcome, a port) at the top level, where a
query can filter on them. ``text`` is for a person reading a terminal.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

#: The ``extra`` key a call puts its structured fields under.
FIELDS = "rerank_fields"
_SEVERITY = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
             logging.CRITICAL: "fatal"}


class JsonLines(logging.Formatter):
    """A record as one JSON object: timestamp (UTC, ISO 8601), severity, message, then the call's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "timestamp": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "severity": _SEVERITY.get(record.levelno, record.levelname.lower()),
            "message": record.getMessage(),
        }
        out.update(getattr(record, FIELDS, None) or {})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False, separators=(",", ":"))


class Text(logging.Formatter):
    """``time level message key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS, None) or {}
        tail = "".join(f" {k}={v}" for k, v in fields.items())
        return f"{self.formatTime(record)} {record.levelname:<7} {record.getMessage()}{tail}"


def configure(logger_name: str, log_format: str, stream: Any = None) -> logging.Logger:
    """Route a process's logger to ``stream`` (stderr) in ``log_format`` (json or text), once."""
    logger = logging.getLogger(logger_name)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLines() if log_format == "json" else Text())
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def event(logger_name: str, message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``message`` with ``fields`` as structured keys."""
    logging.getLogger(logger_name).log(level, message, extra={FIELDS: fields})
