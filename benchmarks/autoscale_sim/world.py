"""The world every controller runs in: a pool's pods (`PoolModel`), what goes wrong around them (`Realism`) and
TEI's own limits. Kept apart so that traffic, observation, simulation and the controllers share one definition of a
pod without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_CONCURRENT = 512     # TEI's --max-concurrent-requests: each replica rejects beyond it
TAIL = 0.05              # the SLO is on the p95: the share of requests that may be late
DELAY_S = 10             # the delay10 variant's actuation delay


@dataclass(frozen=True)
class PoolModel:
    name: str
    throughput: float      # requests/s one replica completes when busy
    base_latency: float    # seconds, p95 at zero load
    startup: float         # seconds from scale-up to ready (before jitter)
    min_replicas: int
    max_replicas: int
    price_per_hour: float

    def capacity_at(self, slo: float) -> float:
        """Requests/s one replica serves with its own p95 at `slo` (the M/M/1 tail solved for rho)."""
        low, high = 0.0, 0.999
        for _ in range(60):
            rho = (low + high) / 2
            p95 = self.base_latency + max(math.log(rho / TAIL), 0.0) / (self.throughput * (1 - rho))
            low, high = (rho, high) if p95 <= slo else (low, rho)
        return low * self.throughput


@dataclass(frozen=True)
class Realism:
    scrape_failure: float = 0.05
    delay_s: int = 0
    cpu_startup_s: float = 40.0
    jitter: float = 0.3          # start-up x U(1, 1 + jitter)
