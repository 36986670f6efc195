"""The live sample (opt-in): a bounded, expiring record of the mirrored requests, kept on the model's volume.

With the tenant's consent (``quantization.requantizeOnDrift`` on the RerankModel) the guard remembers the mirrored
``/rerank`` requests it receives (all of them, sampled or not: the mirror already took a fraction) as
``{"query", "texts", "t"}`` lines, the format the quantization Job reads as evaluation or calibration data
(``quantizer_job.steps.evaluation.evaldata.parse_jsonl``; it ignores ``t``). Bounded by pairs (``max_pairs``, the
oldest requests go first) and by age (``max_age_seconds``). Written every ``WRITE_SECONDS`` when it changed,
atomically (a temporary file in the same directory, fsynced, then renamed), so a Job that starts meanwhile reads a
whole sample, never half of one. A restarted guard picks the file up again, minus what expired. Replayed requests (no
Gateway) are never recorded: they are the artifact's own evaluation pairs, not live traffic.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rerank_contracts.guard import LiveSampleSettings

#: How often the sample is written when it changed: a Job reads a sample at most this old.
WRITE_SECONDS = 30.0
#: The sample's size in bytes at most, whatever its pairs: long passages must not grow the guard's memory (and the
#: file rewritten every WRITE_SECONDS) without bound.
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    t: float
    query: str
    texts: tuple[str, ...]

    def line(self) -> str:
        return json.dumps({"query": self.query, "texts": list(self.texts), "t": round(self.t, 3)},
                          ensure_ascii=False)

    @property
    def size(self) -> int:
        """Bytes it takes in the file, about (UTF-8 of its texts and some framing)."""
        return len(self.query.encode()) + sum(len(t.encode()) + 4 for t in self.texts) + 40


def entry_of(body: Any, t: float) -> Entry | None:
    """A /rerank body as a sample entry; None for one that is not a query with at least one text."""
    if not isinstance(body, Mapping):
        return None
    query, texts = body.get("query"), body.get("texts")
    if not isinstance(query, str) or not query.strip() or not isinstance(texts, list):
        return None
    kept = tuple(t for t in texts if isinstance(t, str) and t)
    return Entry(t, query, kept) if kept else None


class LiveSample:
    """The entries in arrival order, their pair count, and whether the file is behind."""

    def __init__(self, settings: LiveSampleSettings, clock: Callable[[], float] = time.time,
                 max_bytes: int = MAX_BYTES) -> None:
        self.settings, self.clock, self.max_bytes = settings, clock, max_bytes
        self._entries: collections.deque[Entry] = collections.deque()
        self._pairs = self._bytes = 0
        self._dirty = False
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one write at a time: an older snapshot never lands over a newer one
        self.written_pairs = 0

    @property
    def pairs(self) -> int:
        return self._pairs

    def load(self) -> int:
        """Take up the file a previous guard process wrote (lines it cannot read are dropped); returns its pairs."""
        try:
            with open(self.settings.path, encoding="utf-8") as f:
                lines = f.readlines()
        except FileNotFoundError:
            return 0
        with self._lock:
            for raw in lines:
                with contextlib.suppress(ValueError, TypeError):
                    obj = json.loads(raw)
                    found = entry_of(obj, float(obj["t"])) if isinstance(obj, dict) and "t" in obj else None
                    if found is not None:
                        self._append(found)
            self._evict(self.clock())
            self.written_pairs = self._pairs
        return self.written_pairs

    def add(self, body: Any) -> bool:
        """Remember one mirrored request (False: not a rerank request)."""
        found = entry_of(body, self.clock())
        if found is None:
            return False
        if len(found.texts) > self.settings.max_pairs:  # one huge request must not empty the sample
            found = Entry(found.t, found.query, found.texts[:self.settings.max_pairs])
        with self._lock:
            self._append(found)
            self._evict(found.t)
            self._dirty = True
        return True

    def _append(self, entry: Entry) -> None:
        self._entries.append(entry)
        self._pairs += len(entry.texts)
        self._bytes += entry.size

    def _evict(self, now: float) -> None:
        horizon = now - self.settings.max_age_seconds
        while self._entries and (self._pairs > self.settings.max_pairs or self._bytes > self.max_bytes
                                 or self._entries[0].t < horizon):
            gone = self._entries.popleft()
            self._pairs -= len(gone.texts)
            self._bytes -= gone.size
            self._dirty = True

    def write(self) -> int:
        """Write the file if it is behind (expiring what aged meanwhile); returns the pairs it now holds."""
        with self._writing:
            return self._write()

    def _write(self) -> int:
        with self._lock:
            self._evict(self.clock())
            if not self._dirty:
                return self.written_pairs
            text = "".join(e.line() + "\n" for e in self._entries)
            pairs = self._pairs
            self._dirty = False
        directory = os.path.dirname(self.settings.path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".live-", suffix=".tmp", dir=directory)
        try:
            os.fchmod(fd, 0o640)  # the Job reads it as the same user, or through the volume's fsGroup
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.settings.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            with self._lock:
                self._dirty = True  # try again at the next write
            raise
        self.written_pairs = pairs
        return pairs
