"""The operator's API cost, from the API server's audit log: its requests by verb and its writes (leader election's
Lease calls apart), watches opened, and apply->Job latency on the API server's own clock."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from rerank_devcluster import operator_process as op

from .watches import NS_PREFIX, Key

Position = tuple[int, int]  # (inode, byte offset) in the audit log


class AuditTail:
    """Reads the API server's audit log between two positions (blocking mode: an event is there once answered).
    The API server rotates the file at ``--audit-log-maxsize`` (100 MB by default): a position in a rotated file is
    found again by its inode among the backups (``audit-<time>.log``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def position(self) -> Position:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return (0, 0)
        return (st.st_ino, st.st_size)

    def _file_of(self, inode: int) -> Path | None:
        for candidate in [self.path, *self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}")]:
            try:
                if candidate.stat().st_ino == inode:
                    return candidate
            except FileNotFoundError:
                continue
        return None

    def events(self, start: Position, end: Position) -> Iterator[dict[str, Any]]:
        chunks: list[bytes] = []
        if start[0] == end[0]:
            chunks.append(self._read(self.path, start[1], end[1]))
        else:  # rotated in between: the rest of the old file, then the new one up to ``end``
            old = self._file_of(start[0])
            if old is not None:
                chunks.append(self._read(old, start[1], None))
            chunks.append(self._read(self.path, 0, end[1]))
        for data in chunks:
            for line in data.splitlines():
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:  # a line being written
                        continue

    @staticmethod
    def _read(path: Path, start: int, end: int | None) -> bytes:
        try:
            with path.open("rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return b""

    def operator_writes_since(self, start: Position) -> tuple[int, Position]:
        """(writes by the operator after ``start``, the position read up to)."""
        end = self.position()
        writes = sum(1 for e in self.events(start, end)
                     if e.get("user", {}).get("username") == op.OPERATOR_USER and e.get("verb") in op.WRITE_VERBS
                     and e.get("stage") == "ResponseComplete" and not is_lease(e))
        return writes, end


def is_lease(event: dict[str, Any]) -> bool:
    """A call on a Lease: leader election's own renewals, which go on at rest by design."""
    return (event.get("objectRef") or {}).get("resource") == "leases"


def audit_time(stamp: str) -> float:
    """An audit timestamp (RFC 3339 with microseconds) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def apply_to_job_from_audit(events: Iterable[dict[str, Any]]) -> dict[Key, float]:
    """Per model: from the API server receiving its create to the API server having stored the operator's first Job
    for it (both on the API server's clock, microseconds). The Job's name starts with the model's (``<model>-q-``);
    the audit log's Metadata level has no labels."""
    created: dict[Key, float] = {}
    job_stored: dict[Key, float] = {}
    for e in events:
        ref, verb = e.get("objectRef") or {}, e.get("verb")
        if e.get("stage") != "ResponseComplete" or verb != "create" or ref.get("subresource"):
            continue
        failed = e.get("responseStatus", {}).get("code", 201) >= 300
        if failed or not str(ref.get("namespace", "")).startswith(NS_PREFIX):
            continue
        if ref.get("resource") == op.PLURAL:
            created.setdefault((ref["namespace"], ref["name"]), audit_time(e["requestReceivedTimestamp"]))
        elif ref.get("resource") == "jobs" and e.get("user", {}).get("username") == op.OPERATOR_USER:
            key = (ref["namespace"], str(ref.get("name", "")).rsplit("-q-", 1)[0])
            job_stored.setdefault(key, audit_time(e["stageTimestamp"]))
    return {k: job_stored[k] - t for k, t in created.items() if k in job_stored}


def summarize_requests(events: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    by_verb: Counter[str] = Counter()
    by_call: Counter[str] = Counter()
    watches_opened = watches_closed = 0
    for e in events:
        if e.get("user", {}).get("username") != op.OPERATOR_USER:
            continue
        verb, stage = e.get("verb", ""), e.get("stage")
        ref = e.get("objectRef") or {}
        what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        if verb == "watch":
            watches_opened += stage == "ResponseStarted"
            watches_closed += stage == "ResponseComplete"
            if stage == "ResponseStarted":
                by_call[f"watch {what}"] += 1
            continue
        if stage != "ResponseComplete":
            continue
        by_verb[verb] += 1
        by_call[f"{verb} {what}"] += 1
    requests = sum(by_verb.values())
    lease_writes = sum(1 for e in events if e.get("user", {}).get("username") == op.OPERATOR_USER and is_lease(e)
                       and e.get("verb") in op.WRITE_VERBS and e.get("stage") == "ResponseComplete")
    writes = sum(n for v, n in by_verb.items() if v in op.WRITE_VERBS) - lease_writes
    return {
        "requests_per_s": round((requests + watches_opened) / seconds, 3),
        "non_watch_requests_per_s": round(requests / seconds, 3),
        "by_verb_per_s": {v: round(n / seconds, 3) for v, n in sorted(by_verb.items())},
        "writes": writes,
        "lease_writes": lease_writes,
        "watches_opened": watches_opened,
        "watches_opened_per_s": round(watches_opened / seconds, 3),
        "watches_completed": watches_closed,
        "top_calls": [{"call": c, "count": n} for c, n in by_call.most_common(8)],
    }
