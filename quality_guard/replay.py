"""Without a gateway to mirror live traffic: the artifact's evaluation pairs (``Config.replay``) offered as requests.

The replayed bodies go through the same sampler and budget as mirrored copies, and are never kept in the live sample
(:mod:`.sample`): they are the artifact's own evaluation pairs, not live traffic.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .worker import Worker

#: Passages per replayed request: within TEI's default --max-client-batch-size (32), like a typical rerank call.
REPLAY_MAX_TEXTS = 16


def replay_bodies(path: str, seed: int = 0) -> list[dict[str, Any]]:
    """/rerank bodies from a pairs file: one per query with (a seeded sample of at most REPLAY_MAX_TEXTS of) its
    texts; queries with a single text are left out (a ranking needs two)."""
    by_query: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                pair = json.loads(line)
                by_query.setdefault(str(pair["query"]), []).append(str(pair["text"]))
    rng = random.Random(seed)
    return [{"query": q, "texts": ts if len(ts) <= REPLAY_MAX_TEXTS else rng.sample(ts, REPLAY_MAX_TEXTS)}
            for q, ts in by_query.items() if len(ts) >= 2]


class Replayer:
    """Offers a random replayed body to the worker ``per_second`` times a second (the sampler and budget apply)."""

    def __init__(self, worker: Worker, bodies: Sequence[Mapping[str, Any]], per_second: float, seed: int = 0) -> None:
        if not bodies or per_second <= 0:
            raise ValueError("a replay needs bodies and a positive rate")
        self.worker, self.bodies, self.period = worker, list(bodies), 1.0 / per_second
        self.rng = random.Random(seed)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="guard-replay", daemon=True)

    def start(self) -> Replayer:
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopped.wait(self.period):
            self.worker.submit(self.rng.choice(self.bodies))

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
