"""Polling until the cluster converges: the one wait loop tests and the demo share."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "condition", every: float = 0.3) -> Any:
    """Call ``check`` until it returns something truthy and return that; fail with the last value on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
