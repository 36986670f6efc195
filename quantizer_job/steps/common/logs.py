"""Structured JSON logs, one object per line on stderr (stdout's last line is reserved for the result)."""

from __future__ import annotations

import ctypes
import json
import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any


def peak_rss_bytes() -> int:
    """Peak RSS of this process and of its waited-for children (the export child)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) * 1024


def trim_memory() -> None:
    """Give freed heap back to the OS (glibc keeps it otherwise, and peaks add up across stages)."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def log(stage: str, event: str, **fields: Any) -> None:
    rec = {"ts": round(time.time(), 3), "stage": stage, "event": event}
    rec.update(fields)
    sys.stderr.write(json.dumps(rec, default=str, ensure_ascii=False, separators=(",", ":")) + "\n")
    sys.stderr.flush()


class StageRecord(dict[str, Any]):
    """Fields a stage adds to its 'end' log line (sizes, counts)."""


@contextmanager
def stage(name: str, timings: dict[str, float], **start_fields: Any) -> Iterator[StageRecord]:
    rec = StageRecord()
    log(name, "start", **start_fields)
    t0 = time.monotonic()
    try:
        yield rec
    except BaseException as exc:
        dt = time.monotonic() - t0
        timings[name] = round(timings.get(name, 0.0) + dt, 3)
        log(name, "failed", seconds=round(dt, 3), error=f"{type(exc).__name__}: {exc}"[:500],
            peak_rss_bytes=peak_rss_bytes(), **rec)
        raise
    dt = time.monotonic() - t0
    timings[name] = round(timings.get(name, 0.0) + dt, 3)
    log(name, "end", seconds=round(dt, 3), peak_rss_bytes=peak_rss_bytes(), **rec)
