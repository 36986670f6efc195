"""The activator's logs: one line per held request's outcome.
The line's format is every process's (``rerank_contracts/log_lines.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from rerank_contracts import log_lines

LOGGER = "rerank_activator"


def configure(log_format: str, stream: Any = None) -> logging.Logger:
    """Route the activator's logger to ``stream`` (stderr) in ``log_format`` (json or text), once."""
    return log_lines.configure(LOGGER, log_format, stream)


def event(message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``message`` with ``fields`` as structured keys."""
    log_lines.event(LOGGER, message, level, **fields)
