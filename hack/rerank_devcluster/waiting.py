"""Polling until something converges: the one wait loop of the dev cluster, its tests and the demo.

Tests call :func:`eventually` with their defaults (a timeout fails the test with an ``AssertionError``); the
harness passes its own error type (``ClusterError`` while the control plane boots, ``SystemExit`` in the demo)
so that a timeout reads the same everywhere: what was awaited, for how long, and the last value seen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def eventually(check: Callable[[], Any], timeout: float = 60, what: str = "condition", every: float = 0.3, *,
               error: Callable[[str], BaseException] = AssertionError) -> Any:
    """Call ``check`` until it returns something truthy and return that; fail with the last value on timeout.

    ``check`` may raise to give up early (a component died, a resource failed for good); that propagates as is.
    A ``timeout`` of zero or less still fails with the same message, without calling ``check``.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise error(f"timed out after {round(timeout, 1):g}s waiting for {what}; last value: {last!r}")

