"""The sampler's logs: its start, its drain, and the guard becoming unreachable or reachable again (one line per
change, never one per copy: a guard down for an hour must not flood the pod's log at the traffic's rate).
The line's format is every process's (``rerank_contracts/log_lines.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from rerank_contracts import log_lines

LOGGER = "rerank_sampler"


def configure(log_format: str, stream: Any = None) -> logging.Logger:
    """Route the sampler's logger to ``stream`` (stderr) in ``log_format`` (json or text), once."""
    return log_lines.configure(LOGGER, log_format, stream)


def event(message: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log ``message`` with ``fields`` as structured keys."""
    log_lines.event(LOGGER, message, level, **fields)
