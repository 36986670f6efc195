"""The default metrics source: scrape each ready TEI pod's /metrics and aggregate per pool.

No dependency beyond the pods themselves. Rates and quantiles need two scrapes of the same pod, so the source
keeps the previous scrape per pod (keyed by pod name and IP: a replaced pod starts over). Pods that do not answer
within the timeout are left out of this tick's aggregate; if no pod of a pool answers, the pool's signals carry
an error and the policy holds.

A pod's address is ``pod_address(target)`` (its IP and TEI's port), looked up on every scrape; a caller may pass
``address_of`` instead (the unit tests point it at local servers; tests/cluster/scrape_redirect.py, the cluster
tests' operator launcher, replaces ``pod_address`` because kwok pods have no network).
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rerank_operator.core.autoscale import exposition
from rerank_operator.core.autoscale.config import Pool
from rerank_operator.core.autoscale.signals import PoolSignals, Signals

MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_PARALLEL = 8

Fetch = Callable[[str, float], str]


@dataclass(frozen=True)
class PodTarget:
    """A ready pod of a pool, as the operator sees it in the API."""

    name: str
    pool: Pool
    ip: str
    port: int


@dataclass(frozen=True)
class Snapshot:
    """The te_* values of one pod at one scrape."""

    time: float
    address: str
    request_count: float
    success_count: float
    failure_count: float
    queue_size: float
    duration: exposition.Histogram
    queue_duration: exposition.Histogram

    @classmethod
    def from_text(cls, text: str, time_: float, address: str) -> Snapshot:
        samples = exposition.parse(text)
        return cls(
            time=time_,
            address=address,
            # TEI creates a counter on its first increment: absent means zero so far.
            request_count=exposition.total(samples, "te_request_count") or 0.0,
            success_count=exposition.total(samples, "te_request_success") or 0.0,
            failure_count=exposition.total(samples, "te_request_failure") or 0.0,
            queue_size=exposition.total(samples, "te_queue_size") or 0.0,
            duration=exposition.histogram(samples, "te_request_duration") or exposition.Histogram.empty(),
            queue_duration=(exposition.histogram(samples, "te_request_queue_duration")
                            or exposition.Histogram.empty()),
        )


def http_fetch(url: str, timeout: float) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read(MAX_BODY_BYTES)
        return body.decode("utf-8", errors="replace")


def pod_address(target: PodTarget) -> str:
    """Where a ready pod's /metrics answers: its IP and TEI's port."""
    return f"{target.ip}:{target.port}"


class DirectSource:
    """Stateful only in its memory of the previous scrape per pod; one instance per RerankModel."""

    def __init__(self, timeout_seconds: float = 2.0, fetch: Fetch = http_fetch,
                 clock: Callable[[], float] = time.time,
                 address_of: Callable[[PodTarget], str] | None = None) -> None:
        self._timeout = timeout_seconds
        self._address_of = address_of
        self._fetch = fetch
        self._clock = clock
        self._previous: dict[str, Snapshot] = {}

    def collect(self, targets: Sequence[PodTarget], ready: Mapping[Pool, int]) -> Signals:
        """Scrape all targets (in parallel, bounded by the timeout) and return per-pool signals."""
        address_of = self._address_of or pod_address  # the module's, looked up now (see the module docstring)
        addresses = {t.name: address_of(t) for t in targets}
        results = self._scrape_all(addresses)
        current: dict[str, Snapshot] = {}
        errors: dict[str, str] = {}
        for name, result in results.items():
            if isinstance(result, Snapshot):
                current[name] = result
            else:
                errors[name] = result
        pools = {}
        for pool in ("gpu", "cpu"):
            names = [t.name for t in targets if t.pool == pool]
            pools[pool] = aggregate(ready.get(pool, 0), names, self._previous, current, errors)
        self._previous = {name: snap for name, snap in {**self._previous, **current}.items()
                          if name in addresses}
        return Signals(gpu=pools["gpu"], cpu=pools["cpu"])

    def _scrape_all(self, addresses: Mapping[str, str]) -> dict[str, Snapshot | str]:
        if not addresses:
            return {}
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(addresses))) as pool:
            futures = {name: pool.submit(self._scrape, address) for name, address in addresses.items()}
            return {name: future.result() for name, future in futures.items()}

    def _scrape(self, address: str) -> Snapshot | str:
        try:
            text = self._fetch(f"http://{address}/metrics", self._timeout)
            return Snapshot.from_text(text, self._clock(), address)
        except (OSError, urllib.error.URLError, exposition.ExpositionError, ValueError) as exc:
            return f"{address}: {exc}"


def aggregate(ready: int, names: Iterable[str], previous: Mapping[str, Snapshot],
              current: Mapping[str, Snapshot], errors: Mapping[str, str]) -> PoolSignals:
    """Pool signals from this tick's snapshots and the previous ones (pure; the heart of the direct source)."""
    names = list(names)
    answered = [n for n in names if n in current]
    if ready > 0 and not answered:
        detail = "; ".join(errors[n] for n in names if n in errors) or "no ready pod to scrape"
        return PoolSignals(ready_replicas=ready, error=f"no pod answered /metrics ({detail})"[:300])
    pairs = [(previous[n], current[n]) for n in answered
             if n in previous and previous[n].address == current[n].address and current[n].time > previous[n].time]
    base = PoolSignals(ready_replicas=ready, scraped_replicas=len(answered),
                       queue_size=sum(current[n].queue_size for n in answered),
                       sampled_at=max((current[n].time for n in answered), default=None))
    if not pairs:
        return base
    duration = sum((now.duration.since(before.duration) for before, now in pairs), exposition.Histogram.empty())
    waiting = sum((now.queue_duration.since(before.queue_duration) for before, now in pairs),
                  exposition.Histogram.empty())
    return PoolSignals(
        ready_replicas=ready,
        scraped_replicas=len(answered),
        # Per-pod rates summed, then scaled up to all answering pods (pods seen for the first time have no rate).
        request_rate=_rate(pairs, "request_count") * len(answered) / len(pairs),
        success_rate=_rate(pairs, "success_count") * len(answered) / len(pairs),
        failure_rate=_rate(pairs, "failure_count") * len(answered) / len(pairs),
        queue_size=base.queue_size,
        latency_p50_ms=_ms(exposition.quantile(0.5, duration)),
        latency_p95_ms=_ms(exposition.quantile(0.95, duration)),
        queue_time_p95_ms=_ms(exposition.quantile(0.95, waiting)),
        sampled_at=base.sampled_at,
    )


def _rate(pairs: Sequence[tuple[Snapshot, Snapshot]], field: str) -> float:
    """Sum of per-pod counter increases per second (a counter that went down restarted from zero)."""
    total = 0.0
    for before, now in pairs:
        old, new = getattr(before, field), getattr(now, field)
        total += (new - old if new >= old else new) / max(now.time - before.time, 1e-9)
    return total


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
